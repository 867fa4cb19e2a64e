//! The service's tables, as `diesel print-schema` writes them from
//! `migrations/`.

diesel::table! {
    orders (id) {
        id -> Int8,
        tenant_id -> Text,
        customer -> Text,
        total_cents -> Int8,
        created_at -> Timestamptz,
    }
}

diesel::table! {
    order_confirmations (order_id) {
        order_id -> Int8,
        outbox_event_id -> Uuid,
        confirmed_at -> Timestamptz,
    }
}

diesel::joinable!(order_confirmations -> orders (order_id));
diesel::allow_tables_to_appear_in_same_query!(orders, order_confirmations);
