use outbox_publish::OutboxEvent;

#[derive(serde::Serialize, OutboxEvent)]
#[outbox(event_type = "orders.order.shipped")]
struct OrderShipped {
    #[outbox(dispatch_key)]
    order_id: u64,
}

fn main() {}
