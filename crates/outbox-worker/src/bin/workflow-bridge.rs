//! `workflow-bridge`: the signed internal bridge that runs workflow
//! executions for workers in `hybrid` and `http` mode, and stream runs.

fn main() -> std::process::ExitCode {
    outbox_worker::bridge_main()
}
