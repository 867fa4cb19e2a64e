use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
