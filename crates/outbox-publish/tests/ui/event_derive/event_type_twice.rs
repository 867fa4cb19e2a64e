use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "orders.order.created", event_type = "orders.order.placed")]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
