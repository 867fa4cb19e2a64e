//! The `OutboxEvent` derive: implements `outbox_model::TypedEvent` for a
//! payload struct from its `#[outbox(event_type = "…")]` attribute, after
//! checking the event type against the naming rule (`outbox-event-type`,
//! the code `outbox_model::EventType` runs) while the application compiles.
//!
//! Applications use it through `outbox-publish`, which re-exports it with a
//! compiled example; the generated impl names `::outbox_publish::TypedEvent`,
//! so `outbox-publish` is the one dependency it needs. This crate holds the
//! macro only: the trait is `outbox-model`'s, publishing `outbox-publish`'s.

use proc_macro::TokenStream;
use proc_macro2::Span;
use quote::quote;
use syn::{Data, DeriveInput, Fields, LitStr, parse_macro_input};

/// Implements `TypedEvent` for a struct with named fields, with the event
/// type of its `#[outbox(event_type = "<domain>.<entity>.<verb>")]`
/// attribute as the `EVENT_TYPE` constant.
///
/// Refused at compile time, each with its own message: a missing attribute,
/// an event type that breaks the naming rule (the rule's message, at the
/// string), an unknown or repeated key, and anything but a struct with
/// named fields (a payload is a JSON object).
///
/// ```ignore
/// #[derive(serde::Serialize, serde::Deserialize, outbox_publish::OutboxEvent)]
/// #[outbox(event_type = "orders.order.created")]
/// struct OrderCreated {
///     order_id: u64,
/// }
/// ```
#[proc_macro_derive(OutboxEvent, attributes(outbox))]
pub fn derive_outbox_event(input: TokenStream) -> TokenStream {
    let input = parse_macro_input!(input as DeriveInput);
    match expand(&input) {
        Ok(tokens) => tokens.into(),
        Err(error) => error.to_compile_error().into(),
    }
}

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    check_shape(input)?;
    let event_type = event_type(input)?;
    if let Err(broken) = outbox_event_type::check(&event_type.value()) {
        return Err(syn::Error::new(event_type.span(), broken));
    }
    let ident = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_publish::TypedEvent for #ident #type_generics #where_clause {
            const EVENT_TYPE: &'static str = #event_type;
        }
    })
}

/// A payload is a JSON object: only a struct with named fields serializes
/// as one by default.
fn check_shape(input: &DeriveInput) -> syn::Result<()> {
    let what = match &input.data {
        Data::Struct(data) => match data.fields {
            Fields::Named(_) => return Ok(()),
            Fields::Unnamed(_) => "a tuple struct",
            Fields::Unit => "a unit struct",
        },
        Data::Enum(_) => "an enum",
        Data::Union(_) => "a union",
    };
    Err(syn::Error::new(
        input.ident.span(),
        format!(
            "OutboxEvent needs a struct with named fields, found {what}: an event's payload is a JSON object"
        ),
    ))
}

/// The string of the one `#[outbox(event_type = "…")]`.
fn event_type(input: &DeriveInput) -> syn::Result<LitStr> {
    let mut found: Option<LitStr> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("outbox")) {
        attr.parse_nested_meta(|meta| {
            if !meta.path.is_ident("event_type") {
                return Err(meta.error("unknown key in #[outbox(..)]; expected `event_type = \"<domain>.<entity>.<verb>\"`"));
            }
            if found.is_some() {
                return Err(meta.error("`event_type` is given twice; an event has one type"));
            }
            found = Some(meta.value()?.parse()?);
            Ok(())
        })?;
    }
    found.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            format!(
                "OutboxEvent needs the event type: add #[outbox(event_type = \"<domain>.<entity>.<verb>\")] to `{}`",
                input.ident
            ),
        )
    })
}
