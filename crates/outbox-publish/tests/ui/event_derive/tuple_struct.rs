use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
struct OrderCreated(u64);

fn main() {}
