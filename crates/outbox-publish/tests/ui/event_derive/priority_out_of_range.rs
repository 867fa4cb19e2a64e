use outbox_publish::OutboxEvent;

#[derive(serde::Serialize, OutboxEvent)]
#[outbox(event_type = "mail.newsletter.send", priority = -3)]
struct NewsletterSend {
    issue: u32,
}

fn main() {}
