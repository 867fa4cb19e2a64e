use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(event_type = "orders.order.created")]
enum OrderCreated {
    Small { order_id: u64 },
}

fn main() {}
