//! `cargo xtask image`: the container image of `deploy/Dockerfile`, built
//! with podman, also where no registry can be reached.
//!
//! Without `--local-bases` it is `podman build -f deploy/Dockerfile -t
//! outbox:local .` (podman pulls the base images it lacks). With
//! `--local-bases`, each base image the Dockerfile names that podman does
//! not hold yet is built on this machine first, under the same name, so that
//! the Dockerfile builds unmodified with `--pull=never`:
//!
//! - `debian:<suite>-slim`: a `minbase` root file system of Debian's
//!   packages made by `mmdebstrap`, imported with `podman import`;
//! - `rust:<version>-<suite>`: that Debian image with a C toolchain and the
//!   Rust toolchain `<version>` installed by rustup (from
//!   static.rust-lang.org, its checksum verified), laid out as the official
//!   image lays it out (`/usr/local/cargo`, `/usr/local/rustup`).
//!
//! `--compose-images` also builds, from Debian's packages, the images that
//! `deploy/compose.local.yml` gives the compose file's other services
//! (Postgres, Redis, a mail catcher, Prometheus): the stages of
//! `deploy/local/Containerfile`.
//!
//! `--ca-cert` adds a certificate the locally built Rust image trusts
//! (a TLS-intercepting proxy's), for rustup and cargo during the build;
//! the runtime image never receives it. Not part of `cargo xtask test`:
//! the release build inside the image takes many minutes.

use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context, Result, bail};
use clap::Args;

use crate::cmd::{probe, run as step, target_dir, workspace_root};

/// The Dockerfile the command builds, from the workspace root.
const DOCKERFILE: &str = "deploy/Dockerfile";

/// A stand-in for an image of the compose file that comes from Docker Hub.
struct ComposeImage {
    /// The compose file's service, and the stage of `deploy/local/Containerfile`.
    service: &'static str,
    /// The name `deploy/compose.local.yml` gives the service's image.
    image: &'static str,
    /// The Debian packages the stage installs.
    packages: &'static str,
}

/// The stand-ins `--compose-images` builds.
const COMPOSE_IMAGES: [ComposeImage; 4] = [
    ComposeImage {
        service: "postgres",
        image: "localhost/outbox-local-postgres:15",
        packages: "postgresql-15",
    },
    ComposeImage {
        service: "redis",
        image: "localhost/outbox-local-redis:7.0",
        packages: "redis-server",
    },
    ComposeImage {
        service: "mailcatcher",
        image: "localhost/outbox-local-mailcatcher:latest",
        packages: "python3",
    },
    ComposeImage {
        service: "prometheus",
        image: "localhost/outbox-local-prometheus:2.42",
        packages: "prometheus",
    },
];

/// Options of `cargo xtask image`.
#[derive(Args, Debug)]
pub struct ImageArgs {
    /// The name of the built image.
    #[arg(long, default_value = "outbox:local")]
    pub tag: String,
    /// Build the base images the Dockerfile names (`debian:<suite>-slim`,
    /// `rust:<version>-<suite>`) from Debian's packages and rustup when
    /// podman does not hold them, instead of pulling them from a registry.
    #[arg(long)]
    pub local_bases: bool,
    /// With `--local-bases`: build the base images again even when podman
    /// holds them.
    #[arg(long, requires = "local_bases")]
    pub rebuild_bases: bool,
    /// With `--local-bases`: a PEM file of CA certificates the Rust build
    /// image trusts besides Debian's (a TLS-intercepting proxy's), so that
    /// rustup and cargo can download; the runtime image does not get it.
    #[arg(long, value_name = "PEM", requires = "local_bases")]
    pub ca_cert: Option<PathBuf>,
    /// Also build the images `deploy/compose.local.yml` gives the compose
    /// file's Postgres, Redis, mail catcher and Prometheus, from Debian's
    /// packages (`deploy/local/`), for running the compose file where
    /// Docker Hub cannot be reached.
    #[arg(long)]
    pub compose_images: bool,
}

/// A base image this command knows how to build from Debian's packages.
#[derive(Debug, PartialEq, Eq)]
enum Base {
    /// `debian:<suite>-slim`.
    Debian { suite: String },
    /// `rust:<version>-<suite>`.
    Rust { version: String, suite: String },
}

impl Base {
    /// The recipe for `image` (as a `FROM` line names it), or why there is
    /// none.
    fn of(image: &str) -> Result<Self> {
        let recipe = |suite: &str| -> Option<String> {
            (!suite.is_empty() && suite.chars().all(|c| c.is_ascii_lowercase()))
                .then(|| suite.to_owned())
        };
        let base = if let Some(tag) = image.strip_prefix("debian:") {
            tag.strip_suffix("-slim")
                .and_then(recipe)
                .map(|suite| Self::Debian { suite })
        } else if let Some(tag) = image.strip_prefix("rust:") {
            tag.split_once('-').and_then(|(version, suite)| {
                let numeric = version.split('.').all(|p| p.parse::<u32>().is_ok());
                let suite = recipe(suite)?;
                numeric.then(|| Self::Rust {
                    version: version.to_owned(),
                    suite,
                })
            })
        } else {
            None
        };
        base.with_context(|| {
            format!(
                "{DOCKERFILE} builds FROM {image}, which --local-bases cannot build \
                 (it builds debian:<suite>-slim and rust:<version>-<suite>); pull it with \
                 `podman pull {image}` or build without --local-bases"
            )
        })
    }

    /// The image name it is tagged with.
    fn name(&self) -> String {
        match self {
            Self::Debian { suite } => format!("debian:{suite}-slim"),
            Self::Rust { version, suite } => format!("rust:{version}-{suite}"),
        }
    }
}

/// The images the `FROM` lines of `dockerfile` start from, in order,
/// without the ones that name an earlier stage (`FROM build`).
pub fn base_images(dockerfile: &str) -> Vec<String> {
    let mut stages: Vec<String> = Vec::new();
    let mut images = Vec::new();
    for line in dockerfile.lines() {
        let mut words = line.split_whitespace();
        if !words.next().is_some_and(|w| w.eq_ignore_ascii_case("FROM")) {
            continue;
        }
        let Some(image) = words.find(|w| !w.starts_with("--")) else {
            continue;
        };
        if !stages.iter().any(|s| s.eq_ignore_ascii_case(image)) && !images.contains(&image) {
            images.push(image);
        }
        if words.next().is_some_and(|w| w.eq_ignore_ascii_case("AS"))
            && let Some(stage) = words.next()
        {
            stages.push(stage.to_owned());
        }
    }
    images.into_iter().map(str::to_owned).collect()
}

/// The Containerfile of the Rust build image on `debian:<suite>-slim`;
/// `with_ca` adds the certificate copied next to it as `extra-ca.crt`.
fn rust_containerfile(version: &str, suite: &str, with_ca: bool) -> String {
    let copy_ca = if with_ca {
        "COPY extra-ca.crt /usr/local/share/ca-certificates/extra-ca.crt\n"
    } else {
        ""
    };
    format!(
        r#"# The Rust build image, made by `cargo xtask image --local-bases`.
FROM debian:{suite}-slim
{copy_ca}ENV RUSTUP_HOME=/usr/local/rustup \
    CARGO_HOME=/usr/local/cargo \
    PATH=/usr/local/cargo/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    RUST_VERSION={version}
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates curl gcc g++ libc6-dev make pkg-config git \
 && rm -rf /var/lib/apt/lists/* \
 && update-ca-certificates \
 && url="https://static.rust-lang.org/rustup/dist/$(uname -m)-unknown-linux-gnu/rustup-init" \
 && curl -sSfL -o /tmp/rustup-init "$url" \
 && echo "$(curl -sSfL "$url.sha256" | cut -c1-64)  /tmp/rustup-init" | sha256sum -c - \
 && chmod +x /tmp/rustup-init \
 && /tmp/rustup-init -y --no-modify-path --profile minimal --default-toolchain "$RUST_VERSION" \
 && rm /tmp/rustup-init \
 && chmod -R a+w "$RUSTUP_HOME" "$CARGO_HOME" \
 && rustc --version && cargo --version
"#
    )
}

/// The programs a step needs, with the Debian package that brings each.
fn require(programs: &[(&str, &str)]) -> Result<()> {
    let missing: Vec<&str> = programs
        .iter()
        .filter(|(program, _)| !probe(program, &["--version"]))
        .map(|(_, package)| *package)
        .collect();
    if !missing.is_empty() {
        bail!(
            "{} not found; install: apt-get install -y {}",
            missing.join(", "),
            missing.join(" ")
        );
    }
    Ok(())
}

/// Whether podman's storage holds `image` (false without podman).
pub fn podman_has(image: &str) -> bool {
    probe("podman", &["image", "exists", image])
}

/// Builds `base` under its name in `work` (scratch files).
fn build_base(base: &Base, ca_cert: Option<&Path>, work: &Path) -> Result<()> {
    let name = base.name();
    match base {
        Base::Debian { suite } => {
            require(&[("mmdebstrap", "mmdebstrap")])?;
            let tar = work.join(format!("debian-{suite}-minbase.tar"));
            let sources = [
                format!("deb http://deb.debian.org/debian {suite} main"),
                format!("deb http://deb.debian.org/debian {suite}-updates main"),
                format!("deb http://deb.debian.org/debian-security {suite}-security main"),
            ];
            step(
                &format!("mmdebstrap --variant=minbase {suite} (Debian's packages, for {name})"),
                Command::new("mmdebstrap")
                    .args(["--variant=minbase", "--format=tar", suite])
                    .arg(&tar)
                    .args(&sources),
            )?;
            let imported = step(
                &format!("podman import as {name}"),
                Command::new("podman")
                    .args(["import", "--change", r#"CMD ["bash"]"#, "--change"])
                    .arg("ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
                    .arg(&tar)
                    .arg(&name),
            );
            let _ = std::fs::remove_file(&tar);
            imported
        }
        Base::Rust { version, suite } => {
            let dir = work.join(format!("rust-{version}-{suite}"));
            std::fs::create_dir_all(&dir)?;
            if let Some(pem) = ca_cert {
                std::fs::copy(pem, dir.join("extra-ca.crt"))
                    .with_context(|| format!("cannot read --ca-cert {}", pem.display()))?;
            }
            let containerfile = dir.join("Containerfile");
            std::fs::write(
                &containerfile,
                rust_containerfile(version, suite, ca_cert.is_some()),
            )?;
            step(
                &format!("podman build {name} (debian:{suite}-slim and rustup's Rust {version})"),
                Command::new("podman")
                    .args(["build", "--pull=never", "-t", &name, "-f"])
                    .arg(&containerfile)
                    .arg(&dir),
            )
        }
    }
}

/// The base images to build, in the order they must be built: each Rust
/// image's Debian image first, every image once.
fn build_order(images: &[String]) -> Result<Vec<Base>> {
    let mut order: Vec<Base> = Vec::new();
    for image in images {
        let base = Base::of(image)?;
        if let Base::Rust { suite, .. } = &base {
            let debian = Base::Debian {
                suite: suite.clone(),
            };
            if !order.contains(&debian) {
                order.push(debian);
            }
        }
        if !order.contains(&base) {
            order.push(base);
        }
    }
    Ok(order)
}

/// Builds the image (and, with `--local-bases`, the base images podman
/// lacks).
pub fn run(args: ImageArgs) -> Result<()> {
    build(args).context(
        "building the image; where podman cannot start containers at all \
         (setrlimit ... Operation not permitted, cgroups in hybrid mode), docs/operations/deployment.md \
         (\"Building the image with podman, without a registry\") gives the containers.conf",
    )
}

/// The steps of [`run`].
fn build(args: ImageArgs) -> Result<()> {
    require(&[("podman", "podman")])?;
    let root = workspace_root();
    let dockerfile = std::fs::read_to_string(root.join(DOCKERFILE))
        .with_context(|| format!("cannot read {DOCKERFILE}"))?;
    if args.local_bases {
        let work = target_dir().join("image");
        std::fs::create_dir_all(&work)?;
        for base in build_order(&base_images(&dockerfile))? {
            if args.rebuild_bases || !podman_has(&base.name()) {
                build_base(&base, args.ca_cert.as_deref(), &work)?;
            } else {
                eprintln!(
                    "==> {} is in podman's storage (--rebuild-bases builds it again)",
                    base.name()
                );
            }
        }
    }
    let pull = if args.local_bases {
        "--pull=never"
    } else {
        "--pull=missing"
    };
    if args.compose_images {
        let dir = root.join("deploy/local");
        for stand_in in COMPOSE_IMAGES {
            let ComposeImage {
                service,
                image,
                packages,
            } = stand_in;
            step(
                &format!(
                    "podman build {image} (the compose file's {service}, Debian's {packages})"
                ),
                Command::new("podman")
                    .args(["build", pull, "--target", service, "-t", image])
                    .arg(format!("--build-arg=PACKAGES={packages}"))
                    .arg(&dir),
            )?;
        }
    }
    step(
        &format!(
            "podman build -f {DOCKERFILE} -t {} . (a release build)",
            args.tag
        ),
        Command::new("podman")
            .current_dir(&root)
            .args(["build", pull, "-f", DOCKERFILE, "-t", &args.tag, "."]),
    )?;
    eprintln!(
        "\n{} is built. The demo's verdict against it: cargo xtask demo --image {}",
        args.tag, args.tag
    );
    if args.compose_images {
        eprintln!(
            "The compose file on the local images: podman-compose -f deploy/compose.yml \
             -f deploy/compose.local.yml up -d"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_base_images_are_the_from_lines_without_earlier_stages() {
        let dockerfile = "FROM rust:1.95-bookworm AS build\nRUN cargo build\n\
                          FROM --platform=linux/amd64 debian:bookworm-slim\n\
                          COPY --from=build /out/ /usr/local/bin/\nFROM build AS again\n\
                          from debian:bookworm-slim\n";
        assert_eq!(
            base_images(dockerfile),
            ["rust:1.95-bookworm", "debian:bookworm-slim"]
        );
    }

    #[test]
    fn each_rust_image_is_built_after_its_debian_image_and_others_are_refused() {
        let images = [
            "rust:1.95-bookworm".to_owned(),
            "debian:bookworm-slim".to_owned(),
        ];
        assert_eq!(
            build_order(&images).expect("known images"),
            [
                Base::Debian {
                    suite: "bookworm".into()
                },
                Base::Rust {
                    version: "1.95".into(),
                    suite: "bookworm".into()
                },
            ]
        );
        for image in ["rust:latest", "rust:1.95", "alpine:3", "debian:bookworm"] {
            let error = Base::of(image).expect_err(image).to_string();
            assert!(error.contains(&format!("FROM {image}")), "{error}");
        }
    }

    #[test]
    fn compose_local_yml_names_the_images_built_for_services_of_the_compose_file_from_their_stages()
    {
        let root = workspace_root();
        let read = |path: &str| {
            std::fs::read_to_string(root.join(path)).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let compose = read("deploy/compose.yml");
        let local = read("deploy/compose.local.yml");
        let stages = read("deploy/local/Containerfile");
        for ComposeImage { service, image, .. } in COMPOSE_IMAGES {
            assert!(
                compose.contains(&format!("\n  {service}:\n")),
                "deploy/compose.yml has no service {service}"
            );
            assert!(
                local.contains(&format!("\n  {service}:\n    image: {image}\n")),
                "deploy/compose.local.yml does not give {service} the image {image}"
            );
            assert!(
                stages.contains(&format!("\nFROM packages AS {service}\n")),
                "deploy/local/Containerfile has no stage {service}"
            );
        }
        assert_eq!(
            local.matches("\n    image: ").count(),
            COMPOSE_IMAGES.len(),
            "deploy/compose.local.yml names an image --compose-images does not build"
        );
    }

    #[test]
    fn the_rust_image_copies_the_extra_certificate_only_when_one_is_given() {
        let with = rust_containerfile("1.95", "bookworm", true);
        assert!(with.starts_with("# The Rust build image"));
        assert!(with.contains("FROM debian:bookworm-slim\nCOPY extra-ca.crt "));
        assert!(with.contains("RUST_VERSION=1.95\n"));
        assert!(!rust_containerfile("1.95", "bookworm", false).contains("extra-ca.crt"));
    }
}
