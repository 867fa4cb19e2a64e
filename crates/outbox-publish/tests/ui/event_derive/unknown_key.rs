use outbox_publish::OutboxEvent;

#[derive(OutboxEvent)]
#[outbox(name = "orders.order.created")]
struct OrderCreated {
    order_id: u64,
}

fn main() {}
