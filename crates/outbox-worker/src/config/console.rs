//! [`ConsoleConfig`]: whether and where `worker-general` serves the
//! operator console (`outbox-console`), and who may use it.

use std::net::SocketAddr;

use outbox_console::Tokens;
use outbox_env::Text;

use super::ConfigError;

/// The default of `OUTBOX_CONSOLE_ADDR`: the loopback interface only, so
/// that the console is reached through a tunnel or a TLS proxy that
/// stands in front of it, never straight from the network.
pub const DEFAULT_CONSOLE_ADDR: &str = "127.0.0.1:9470";

/// `OUTBOX_CONSOLE_TOKENS`: [`ConsoleConfig::tokens`]; the console is
/// served only when it is set.
pub const OUTBOX_CONSOLE_TOKENS: Text = Text {
    name: "OUTBOX_CONSOLE_TOKENS",
    default: "unset (no console)",
    form: "[name=]reader|operator:token, comma-separated; tokens of 16 characters or more",
    meaning: "worker-general: serve the operator console, to these tokens (readers look, operators also act: requeue, replay, cancel, put dead jobs back, answer and cancel workflow runs); never printed",
};

/// `OUTBOX_CONSOLE_ADDR`: [`ConsoleConfig::addr`].
pub const OUTBOX_CONSOLE_ADDR: Text = Text {
    name: "OUTBOX_CONSOLE_ADDR",
    default: DEFAULT_CONSOLE_ADDR,
    form: "host:port",
    meaning: "where worker-general serves the operator console when OUTBOX_CONSOLE_TOKENS is set (loopback by default: put a TLS proxy in front to reach it from elsewhere)",
};

/// The console `worker-general` serves.
#[derive(Debug, Clone)]
pub struct ConsoleConfig {
    /// `OUTBOX_CONSOLE_ADDR` ([`DEFAULT_CONSOLE_ADDR`]).
    pub addr: SocketAddr,
    /// `OUTBOX_CONSOLE_TOKENS`. Its `Debug` shows names and roles only.
    pub tokens: Tokens,
}

impl ConsoleConfig {
    /// The console of `OUTBOX_CONSOLE_TOKENS` and `OUTBOX_CONSOLE_ADDR`,
    /// or `None` when no tokens are set (the default: no console).
    ///
    /// # Errors
    ///
    /// A [`ConfigError`] naming the variable: tokens that do not parse (the
    /// message names the entry, never the token), an address that is no
    /// `host:port`, or an address without tokens (nobody could sign in).
    pub fn from_lookup(get: &dyn Fn(&str) -> Option<String>) -> Result<Option<Self>, ConfigError> {
        let addr_text = OUTBOX_CONSOLE_ADDR.read(get);
        let Some(raw_tokens) = OUTBOX_CONSOLE_TOKENS.read(get) else {
            return match addr_text {
                Some(addr) => Err(OUTBOX_CONSOLE_ADDR.refuse(
                    addr,
                    "is set but OUTBOX_CONSOLE_TOKENS is not: nobody could sign in to the console",
                )),
                None => Ok(None),
            };
        };
        let tokens = Tokens::parse(&raw_tokens)
            .map_err(|e| OUTBOX_CONSOLE_TOKENS.refuse("(not shown)", e.to_string()))?;
        if tokens.is_empty() {
            return Err(OUTBOX_CONSOLE_TOKENS.refuse("(not shown)", "holds no token"));
        }
        let text = addr_text.unwrap_or_else(|| DEFAULT_CONSOLE_ADDR.to_owned());
        let addr = text.trim().parse().map_err(|_| {
            OUTBOX_CONSOLE_ADDR.refuse(text.clone(), "must be host:port, like 127.0.0.1:9470")
        })?;
        Ok(Some(Self { addr, tokens }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn read(vars: &[(&str, &str)]) -> Result<Option<ConsoleConfig>, ConfigError> {
        ConsoleConfig::from_lookup(&|name| {
            vars.iter()
                .find(|(n, _)| *n == name)
                .map(|(_, v)| (*v).to_owned())
        })
    }

    #[test]
    fn the_console_is_off_without_tokens_and_on_loopback_with_them() {
        assert!(read(&[]).unwrap().is_none());
        let on = read(&[("OUTBOX_CONSOLE_TOKENS", "reader:0123456789abcdef")])
            .unwrap()
            .unwrap();
        assert_eq!(on.addr, DEFAULT_CONSOLE_ADDR.parse().unwrap());
        assert!(on.addr.ip().is_loopback());
    }

    #[test]
    fn wrong_values_name_the_variable_and_never_the_token() {
        let no_tokens = read(&[("OUTBOX_CONSOLE_ADDR", "127.0.0.1:9470")]).unwrap_err();
        assert!(
            no_tokens
                .to_string()
                .contains("OUTBOX_CONSOLE_TOKENS is not")
        );
        let short = read(&[("OUTBOX_CONSOLE_TOKENS", "operator:tiny-secret")]).unwrap_err();
        let message = short.to_string();
        assert!(message.contains("OUTBOX_CONSOLE_TOKENS"), "{message}");
        assert!(!message.contains("tiny-secret"), "{message}");
        let bad_addr = read(&[
            ("OUTBOX_CONSOLE_TOKENS", "reader:0123456789abcdef"),
            ("OUTBOX_CONSOLE_ADDR", "nine"),
        ])
        .unwrap_err();
        assert!(bad_addr.to_string().contains("OUTBOX_CONSOLE_ADDR"));
    }
}
