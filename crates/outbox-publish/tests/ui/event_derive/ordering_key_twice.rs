use outbox_publish::OutboxEvent;

#[derive(serde::Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.shipped")]
struct OrderShipped {
    #[outbox(ordering_key)]
    order_id: u64,
    #[outbox(ordering_key)]
    customer_id: u64,
}

fn main() {}
