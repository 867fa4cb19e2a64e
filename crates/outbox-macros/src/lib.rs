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
/// Two options ride along with every event of the type:
///
/// - `#[outbox(priority = N)]` next to `event_type`, `N` from -2 (bulk) to
///   2 (most urgent), 0 when left out: the `PRIORITY` constant;
/// - `#[outbox(ordering_key)]` on one field: events whose field has the
///   same value are delivered one at a time in the order they were
///   written; the key is the field's `Display` text (an `Option` field gives
///   no key when `None`).
///
/// Refused at compile time, each with its own message: a missing attribute,
/// an event type that breaks the naming rule (the rule's message, at the
/// string), an unknown or repeated key, a priority out of range, an ordering
/// key on two fields, and anything but a struct with named fields (a
/// payload is a JSON object).
///
/// ```ignore
/// #[derive(serde::Serialize, serde::Deserialize, outbox_publish::OutboxEvent)]
/// #[outbox(event_type = "orders.order.created", priority = 1)]
/// struct OrderCreated {
///     #[outbox(ordering_key)]
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

/// The priorities an event may have, lowest first (`outbox_event.priority`'s
/// check constraint).
const PRIORITIES: std::ops::RangeInclusive<i16> = -2..=2;

fn expand(input: &DeriveInput) -> syn::Result<proc_macro2::TokenStream> {
    let fields = named_fields(input)?;
    let options = options(input)?;
    if let Err(broken) = outbox_event_type::check(&options.event_type.value()) {
        return Err(syn::Error::new(options.event_type.span(), broken));
    }
    let event_type = &options.event_type;
    let priority = options.priority.map(|p| {
        let level = syn::Ident::new(priority_name(p), Span::call_site());
        quote! { const PRIORITY: ::outbox_publish::Priority = ::outbox_publish::Priority::#level; }
    });
    let ordering_key = ordering_key_field(fields)?.map(|field| {
        let ident = &field.ident;
        if is_option(&field.ty) {
            quote! {
                fn ordering_key(&self) -> ::core::option::Option<::std::string::String> {
                    self.#ident.as_ref().map(::std::string::ToString::to_string)
                }
            }
        } else {
            quote! {
                fn ordering_key(&self) -> ::core::option::Option<::std::string::String> {
                    ::core::option::Option::Some(::std::string::ToString::to_string(&self.#ident))
                }
            }
        }
    });
    let ident = &input.ident;
    let (impl_generics, type_generics, where_clause) = input.generics.split_for_impl();
    Ok(quote! {
        #[automatically_derived]
        impl #impl_generics ::outbox_publish::TypedEvent for #ident #type_generics #where_clause {
            const EVENT_TYPE: &'static str = #event_type;
            #priority
            #ordering_key
        }
    })
}

/// A payload is a JSON object: only a struct with named fields serializes
/// as one by default.
fn named_fields(input: &DeriveInput) -> syn::Result<&syn::FieldsNamed> {
    let what = match &input.data {
        Data::Struct(data) => match &data.fields {
            Fields::Named(fields) => return Ok(fields),
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

/// What the struct's `#[outbox(..)]` says.
struct Options {
    event_type: LitStr,
    priority: Option<i16>,
}

/// The keys of the struct's `#[outbox(..)]`: `event_type` (required) and
/// `priority`.
fn options(input: &DeriveInput) -> syn::Result<Options> {
    let mut event_type: Option<LitStr> = None;
    let mut priority: Option<i16> = None;
    for attr in input.attrs.iter().filter(|a| a.path().is_ident("outbox")) {
        attr.parse_nested_meta(|meta| {
            if meta.path.is_ident("event_type") {
                if event_type.is_some() {
                    return Err(meta.error("`event_type` is given twice; an event has one type"));
                }
                event_type = Some(meta.value()?.parse()?);
                Ok(())
            } else if meta.path.is_ident("priority") {
                if priority.is_some() {
                    return Err(meta.error("`priority` is given twice"));
                }
                let literal: syn::Expr = meta.value()?.parse()?;
                priority = Some(parse_priority(&literal)?);
                Ok(())
            } else {
                Err(meta.error(
                    "unknown key in #[outbox(..)]; expected `event_type = \"<domain>.<entity>.<verb>\"` or `priority = <-2..=2>`",
                ))
            }
        })?;
    }
    let event_type = event_type.ok_or_else(|| {
        syn::Error::new(
            Span::call_site(),
            format!(
                "OutboxEvent needs the event type: add #[outbox(event_type = \"<domain>.<entity>.<verb>\")] to `{}`",
                input.ident
            ),
        )
    })?;
    Ok(Options {
        event_type,
        priority,
    })
}

/// The name of `outbox_publish::Priority`'s constant for a level of
/// [`PRIORITIES`].
fn priority_name(level: i16) -> &'static str {
    match level {
        -2 => "LOWEST",
        -1 => "LOW",
        1 => "HIGH",
        2 => "HIGHEST",
        _ => "NORMAL",
    }
}

/// An integer literal, possibly negated, within [`PRIORITIES`].
fn parse_priority(expr: &syn::Expr) -> syn::Result<i16> {
    let (negative, literal) = match expr {
        syn::Expr::Unary(syn::ExprUnary {
            op: syn::UnOp::Neg(_),
            expr,
            ..
        }) => (true, expr.as_ref()),
        other => (false, other),
    };
    let out_of_range = || {
        syn::Error::new_spanned(
            expr,
            format!(
                "priority must be an integer from {} (bulk) to {} (most urgent); 0 is normal",
                PRIORITIES.start(),
                PRIORITIES.end()
            ),
        )
    };
    let syn::Expr::Lit(syn::ExprLit {
        lit: syn::Lit::Int(int),
        ..
    }) = literal
    else {
        return Err(out_of_range());
    };
    let value: i16 = int.base10_parse().map_err(|_| out_of_range())?;
    let value = if negative { -value } else { value };
    if PRIORITIES.contains(&value) {
        Ok(value)
    } else {
        Err(out_of_range())
    }
}

/// The one field marked `#[outbox(ordering_key)]`, if any.
fn ordering_key_field(fields: &syn::FieldsNamed) -> syn::Result<Option<&syn::Field>> {
    let mut found: Option<&syn::Field> = None;
    for field in &fields.named {
        for attr in field.attrs.iter().filter(|a| a.path().is_ident("outbox")) {
            attr.parse_nested_meta(|meta| {
                if !meta.path.is_ident("ordering_key") {
                    return Err(meta
                        .error("unknown key in a field's #[outbox(..)]; expected `ordering_key`"));
                }
                if found.is_some() {
                    return Err(meta
                        .error("`ordering_key` is on two fields; an event has one ordering key"));
                }
                found = Some(field);
                Ok(())
            })?;
        }
    }
    Ok(found)
}

/// Whether a field's type is written `Option<..>` (or a path ending in it).
fn is_option(ty: &syn::Type) -> bool {
    matches!(ty, syn::Type::Path(path)
        if path.qself.is_none()
            && path.path.segments.last().is_some_and(|segment| segment.ident == "Option"))
}
