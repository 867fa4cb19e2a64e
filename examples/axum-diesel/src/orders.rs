//! The business endpoint: orders, placed with their event in one
//! transaction, and read back with their confirmation.

use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use diesel::prelude::*;
use diesel::result::{DatabaseErrorKind, Error as DieselError};
use diesel_async::{AsyncConnection, AsyncPgConnection, RunQueryDsl};
use outbox_publish::{OutboxTx, PublishError, publish};
use serde::{Deserialize, Serialize};

use crate::schema::{order_confirmations, orders};
use crate::{OrderPlaced, Pool};

/// The body of `POST /orders`.
#[derive(Debug, Clone, Serialize, Deserialize, Insertable)]
#[diesel(table_name = orders)]
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
    Database(DieselError),
    /// No connection from the pool.
    #[error("no database connection: {0}")]
    Pool(String),
}

impl From<DieselError> for OrderError {
    fn from(e: DieselError) -> Self {
        match e {
            DieselError::DatabaseError(DatabaseErrorKind::CheckViolation, info) => {
                Self::Refused(info.message().to_owned())
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
            Self::Publish(_) | Self::Database(_) | Self::Pool(_) => {
                tracing::error!(error = %self, "order request failed");
                StatusCode::INTERNAL_SERVER_ERROR
            }
        };
        (status, self.to_string()).into_response()
    }
}

/// `POST /orders` and `GET /orders/{id}`.
pub fn routes(pool: Pool) -> Router {
    Router::new()
        .route("/orders", post(place_order))
        .route("/orders/{id}", get(show_order))
        .with_state(pool)
}

async fn place_order(
    State(pool): State<Pool>,
    Json(order): Json<NewOrder>,
) -> Result<(StatusCode, Json<Order>), OrderError> {
    let mut conn = pool
        .get()
        .await
        .map_err(|e| OrderError::Pool(e.to_string()))?;
    Ok((StatusCode::CREATED, Json(place(&mut conn, order).await?)))
}

async fn show_order(
    State(pool): State<Pool>,
    Path(id): Path<i64>,
) -> Result<Json<Order>, OrderError> {
    let mut conn = pool
        .get()
        .await
        .map_err(|e| OrderError::Pool(e.to_string()))?;
    Ok(Json(find(&mut conn, id).await?))
}

/// Inserts the order and publishes its [`OrderPlaced`] in one
/// transaction: both are committed, or neither.
///
/// # Errors
///
/// [`OrderError::Refused`] for a negative total; a publishing or database
/// error otherwise. Either way nothing was committed.
pub async fn place(conn: &mut AsyncPgConnection, order: NewOrder) -> Result<Order, OrderError> {
    conn.transaction::<_, OrderError, _>(async |conn| {
        let id: i64 = diesel::insert_into(orders::table)
            .values(&order)
            .returning(orders::id)
            .get_result(conn)
            .await?;
        let placed = OrderPlaced {
            order_id: id,
            customer: order.customer.clone(),
            total_cents: order.total_cents,
        };
        let tx = OutboxTx::new(conn).map_err(PublishError::from)?;
        publish(&tx, order.tenant_id.as_str(), &placed).await?;
        Ok(Order {
            id,
            tenant_id: order.tenant_id,
            customer: order.customer,
            total_cents: order.total_cents,
            confirmed: false,
        })
    })
    .await
}

/// The order `id` with whether it is confirmed.
///
/// # Errors
///
/// [`OrderError::NotFound`], or a database error.
pub async fn find(conn: &mut AsyncPgConnection, id: i64) -> Result<Order, OrderError> {
    let row: Option<(i64, String, String, i64, Option<i64>)> = orders::table
        .left_join(order_confirmations::table)
        .filter(orders::id.eq(id))
        .select((
            orders::id,
            orders::tenant_id,
            orders::customer,
            orders::total_cents,
            order_confirmations::order_id.nullable(),
        ))
        .first(conn)
        .await
        .optional()?;
    let (id, tenant_id, customer, total_cents, confirmation) =
        row.ok_or(OrderError::NotFound(id))?;
    Ok(Order {
        id,
        tenant_id,
        customer,
        total_cents,
        confirmed: confirmation.is_some(),
    })
}

/// Records that the order's event was handled (once per order, whatever
/// the number of deliveries).
///
/// # Errors
///
/// A database error.
pub async fn confirm(
    conn: &mut AsyncPgConnection,
    order_id: i64,
    event_id: uuid::Uuid,
) -> Result<(), DieselError> {
    diesel::insert_into(order_confirmations::table)
        .values((
            order_confirmations::order_id.eq(order_id),
            order_confirmations::outbox_event_id.eq(event_id),
        ))
        .on_conflict_do_nothing()
        .execute(conn)
        .await
        .map(|_| ())
}
