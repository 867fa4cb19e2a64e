use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "orders.order_line.created")]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
