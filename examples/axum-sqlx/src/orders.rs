//! The business endpoint: orders, placed with their event in one sqlx
//! transaction, and read back with their confirmation.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use outbox_publish::PublishError;
use serde::{Deserialize, Serialize};
use sqlx::error::ErrorKind;
use sqlx::{PgPool, Postgres, Transaction};

use crate::OrderPlaced;

/// The body of `POST /orders`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct NewOrder {
    /// The tenant the order (and its event) belongs to.
    pub tenant_id: String,
    /// Who orders.
    pub customer: String,
    /// The total, in cents (the table refuses a negative one).
    pub total_cents: i64,
}

/// An order as `GET /orders/{id}` shows it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Order {
    /// Its id.
    pub id: i64,
    /// Its tenant.
    pub tenant_id: String,
    /// Who ordered.
    pub customer: String,
    /// The total, in cents.
    pub total_cents: i64,
    /// Whether the handler of its `OrderPlaced` event has run.
    pub confirmed: bool,
}

/// What placing or reading an order failed on.
#[derive(Debug, thiserror::Error)]
pub enum OrderError {
    /// The table's CHECK refused the order (a negative total).
    #[error("the order was refused: {0}")]
    Refused(String),
    /// No order has this id.
    #[error("no order {0}")]
    NotFound(i64),
    /// The event could not be published (the transaction rolled back).
    #[error(transparent)]
    Publish(#[from] PublishError),
    /// Any other database error.
    #[error(transparent)]
    Database(sqlx::Error),
}

impl From<sqlx::Error> for OrderError {
    fn from(e: sqlx::Error) -> Self {
        match e {
            sqlx::Error::Database(db) if db.kind() == ErrorKind::CheckViolation => {
                Self::Refused(db.message().to_owned())
            }
            other => Self::Database(other),
        }
    }
}

impl IntoResponse for OrderError {
    fn into_response(self) -> Response {
        let status = match self {
            Self::Refused(_) => StatusCode::UNPROCESSABLE_ENTITY,
            Self::NotFound(_) => StatusCode::NOT_FOUND,
            Self::Publish(_) | Self::Database(_) => {
                tracing::error!(error = %self, "order request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (status, self.to_string()).into_response()
    }
}

/// `POST /orders` and `GET /orders/{id}`.
pub fn routes(pool: PgPool) -> Router {
    Router::new()
        .route("/orders", post(place_order))
        .route("/orders/{id}", get(show_order))
        .with_state(pool)
}

async fn place_order(
    State(pool): State<PgPool>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Order>), OrderError> {
    let mut tx = pool.begin().await?;
    let placed = place(&mut tx, order).await?;
    tx.commit().await?;
    Ok((StatusCode::CREATED, Json(placed)))
}

async fn show_order(
    State(pool): State<PgPool>,
    Path(id): Path<i64>,
) -> Result<Json<Order>, OrderError> {
    Ok(Json(find(&pool, id).await?))
}

/// Inserts the order and publishes its [`OrderPlaced`] in the caller's
/// transaction `tx`: both are committed when the caller commits, or
/// neither.
///
/// # Errors
///
/// [`OrderError::Refused`] for a negative total; a publishing or database
/// error otherwise. Either way the transaction is to be rolled back
/// (dropping it does).
pub async fn place(
    tx: &mut Transaction<'_, Postgres>,
    order: NewOrder,
) -> Result<Order, OrderError> {
    let (id,): (i64,) = sqlx::query_as(
        "INSERT INTO orders (tenant_id, customer, total_cents) VALUES ($1, $2, $3) RETURNING id",
    )
    .bind(&order.tenant_id)
    .bind(&order.customer)
    .bind(order.total_cents)
    .fetch_one(&mut **tx)
    .await?;
    let placed = OrderPlaced {
        order_id: id,
        customer: order.customer.clone(),
        total_cents: order.total_cents,
    };
    outbox_publish::sqlx::publish(tx, order.tenant_id.as_str(), &placed).await?;
    Ok(Order {
        id,
        tenant_id: order.tenant_id,
        customer: order.customer,
        total_cents: order.total_cents,
        confirmed: false,
    })
}

/// The order `id` with whether it is confirmed.
///
/// # Errors
///
/// [`OrderError::NotFound`], or a database error.
pub async fn find(pool: &PgPool, id: i64) -> Result<Order, OrderError> {
    let row: Option<(i64, String, String, i64, bool)> = sqlx::query_as(
        "SELECT o.id, o.tenant_id, o.customer, o.total_cents, c.order_id IS NOT NULL \
         FROM orders o LEFT JOIN order_confirmations c ON c.order_id = o.id \
         WHERE o.id = $1",
    )
    .bind(id)
    .fetch_optional(pool)
    .await?;
    let (id, tenant_id, customer, total_cents, confirmed) = row.ok_or(OrderError::NotFound(id))?;
    Ok(Order {
        id,
        tenant_id,
        customer,
        total_cents,
        confirmed,
    })
}

/// Records that the order's event was handled (once per order, whatever
/// the number of deliveries).
///
/// # Errors
///
/// A database error.
pub async fn confirm(pool: &PgPool, order_id: i64, event_id: uuid::Uuid) -> sqlx::Result<()> {
    sqlx::query(
        "INSERT INTO order_confirmations (order_id, outbox_event_id) VALUES ($1, $2) \
         ON CONFLICT (order_id) DO NOTHING",
    )
    .bind(order_id)
    .bind(event_id)
    .execute(pool)
    .await
    .map(|_| ())
}
