use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "orders..created")]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
