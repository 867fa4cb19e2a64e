//! `worker-general`: the dispatcher, retention, and the general queue group.

fn main() -> std::process::ExitCode {
    outbox_worker::main_for(outbox_worker::Group::General)
}
