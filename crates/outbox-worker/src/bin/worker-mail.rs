//! `worker-mail`: the mail queue group (mail, webhooks, marketing, SMTP).

fn main() -> std::process::ExitCode {
    outbox_worker::main_for(outbox_worker::Group::Mail)
}
