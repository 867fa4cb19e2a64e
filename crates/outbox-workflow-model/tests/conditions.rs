//! The condition language, table-driven: what each operator answers, which
//! operands it refuses, and which JSON is not a condition.

use outbox_workflow_model::{
    CompareOp, Condition, ConditionError, JsonType, MAX_CONDITION_DEPTH, Operand,
};
use serde_json::{Value, json};

fn ctx() -> Value {
    json!({
        "input": {
            "order": { "total": 120, "price": 99.5, "status": "paid", "tags": ["vip", 3],
                       "customer": { "email": "ann@example.test" }, "note": null },
            "big": 18446744073709551615u64,
            "neg": -1
        },
        "vars": { "limit": 100 },
        "blocks": { "fetch": { "output": { "status": 200 } } }
    })
}

fn parse(value: Value) -> Condition {
    serde_json::from_value(value.clone()).unwrap_or_else(|err| panic!("{value}: {err}"))
}

#[test]
fn comparisons_evaluate() {
    let cases: &[(Value, bool)] = &[
        // eq / ne: numbers by value, the rest structurally
        (
            json!({ "left": { "var": "input.order.total" }, "op": "eq", "right": 120 }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.total" }, "op": "eq", "right": 120.0 }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.status" }, "op": "eq", "right": "paid" }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.status" }, "op": "ne", "right": "paid" }),
            false,
        ),
        (
            json!({ "left": { "var": "input.order.tags" }, "op": "eq", "right": ["vip", 3] }),
            true,
        ),
        (
            json!({ "left": { "var": "input.missing" }, "op": "eq", "right": null }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.total" }, "op": "eq", "right": "120" }),
            false,
        ),
        // ordering, numbers only
        (
            json!({ "left": { "var": "input.order.total" }, "op": "gt", "right": { "var": "vars.limit" } }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.total" }, "op": "gt", "right": 120 }),
            false,
        ),
        (
            json!({ "left": { "var": "input.order.total" }, "op": "gte", "right": 120 }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.price" }, "op": "lt", "right": 100 }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.price" }, "op": "lte", "right": 99.5 }),
            true,
        ),
        (
            json!({ "left": { "var": "input.neg" }, "op": "lt", "right": { "var": "input.big" } }),
            true,
        ),
        (
            json!({ "left": { "var": "input.big" }, "op": "gt", "right": 1.5 }),
            true,
        ),
        (
            json!({ "left": { "var": "blocks.fetch.output.status" }, "op": "eq", "right": 200 }),
            true,
        ),
        // contains: substring, element, key
        (
            json!({ "left": { "var": "input.order.customer.email" }, "op": "contains", "right": "@example" }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.tags" }, "op": "contains", "right": "vip" }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.tags" }, "op": "contains", "right": 3.0 }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.tags" }, "op": "contains", "right": "new" }),
            false,
        ),
        (
            json!({ "left": { "var": "input.order.customer" }, "op": "contains", "right": "email" }),
            true,
        ),
        // startsWith
        (
            json!({ "left": { "var": "input.order.status" }, "op": "startsWith", "right": "pa" }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.status" }, "op": "startsWith", "right": "id" }),
            false,
        ),
        // exists: present and not null
        (
            json!({ "left": { "var": "input.order.status" }, "op": "exists" }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.note" }, "op": "exists" }),
            false,
        ),
        (
            json!({ "left": { "var": "input.nothing.here" }, "op": "exists" }),
            false,
        ),
        // in
        (
            json!({ "left": { "var": "input.order.status" }, "op": "in", "right": ["paid", "sent"] }),
            true,
        ),
        (
            json!({ "left": { "var": "input.order.total" }, "op": "in", "right": [1, 120.0] }),
            true,
        ),
        (json!({ "left": "x", "op": "in", "right": [] }), false),
    ];
    for (json, expected) in cases {
        assert_eq!(
            parse(json.clone()).evaluate(&ctx()),
            Ok(*expected),
            "{json}"
        );
    }
}

#[test]
fn combinations_evaluate_and_short_circuit() {
    let yes = json!({ "left": 1, "op": "eq", "right": 1 });
    let no = json!({ "left": 1, "op": "eq", "right": 2 });
    let broken = json!({ "left": "a", "op": "gt", "right": 1 });
    let cases: &[(Value, Result<bool, ConditionError>)] = &[
        (json!({ "all": [yes, yes] }), Ok(true)),
        (json!({ "all": [yes, no] }), Ok(false)),
        (json!({ "all": [] }), Ok(true)),
        (json!({ "any": [no, yes] }), Ok(true)),
        (json!({ "any": [no, no] }), Ok(false)),
        (json!({ "any": [] }), Ok(false)),
        (json!({ "not": no }), Ok(true)),
        (json!({ "not": { "not": yes } }), Ok(true)),
        // evaluation stops before the broken comparison …
        (json!({ "all": [no, broken] }), Ok(false)),
        (json!({ "any": [yes, broken] }), Ok(true)),
        // … and reports it when it gets there
        (
            json!({ "any": [no, broken] }),
            Err(ConditionError::NotNumbers {
                op: CompareOp::Gt,
                left: JsonType::String,
                right: JsonType::Number,
            }),
        ),
    ];
    for (json, expected) in cases {
        assert_eq!(&parse(json.clone()).evaluate(&ctx()), expected, "{json}");
    }
}

#[test]
fn operands_an_operator_does_not_take_are_typed_errors() {
    use CompareOp::*;
    use JsonType as T;
    let cases: &[(Value, ConditionError)] = &[
        (
            json!({ "left": { "var": "input.missing" }, "op": "gt", "right": 1 }),
            ConditionError::NotNumbers {
                op: Gt,
                left: T::Null,
                right: T::Number,
            },
        ),
        (
            json!({ "left": "10", "op": "lte", "right": 20 }),
            ConditionError::NotNumbers {
                op: Lte,
                left: T::String,
                right: T::Number,
            },
        ),
        (
            json!({ "left": 1, "op": "lt", "right": true }),
            ConditionError::NotNumbers {
                op: Lt,
                left: T::Number,
                right: T::Bool,
            },
        ),
        (
            json!({ "left": 5, "op": "contains", "right": 5 }),
            ConditionError::InvalidOperands {
                op: Contains,
                left: T::Number,
                right: T::Number,
            },
        ),
        (
            json!({ "left": { "var": "input.order.customer" }, "op": "contains", "right": 1 }),
            ConditionError::InvalidOperands {
                op: Contains,
                left: T::Object,
                right: T::Number,
            },
        ),
        (
            json!({ "left": ["a"], "op": "startsWith", "right": "a" }),
            ConditionError::InvalidOperands {
                op: StartsWith,
                left: T::Array,
                right: T::String,
            },
        ),
        (
            json!({ "left": "a", "op": "in", "right": "abc" }),
            ConditionError::InvalidOperands {
                op: In,
                left: T::String,
                right: T::String,
            },
        ),
    ];
    for (json, expected) in cases {
        assert_eq!(
            parse(json.clone()).evaluate(&ctx()),
            Err(expected.clone()),
            "{json}"
        );
    }
}

#[test]
fn what_is_not_a_condition() {
    let cases: &[(Value, &str)] = &[
        (json!({}), "empty condition"),
        (
            json!({ "all": [], "not": { "left": 1, "op": "exists" } }),
            "mixes all and not",
        ),
        (
            json!({ "left": 1, "op": "eq", "all": [] }),
            "mixes left/op/right and all",
        ),
        (json!({ "left": 1, "right": 2 }), "without `op`"),
        (json!({ "op": "eq", "right": 2 }), "`eq` without `left`"),
        (json!({ "left": 1, "op": "eq" }), "`eq` without `right`"),
        (
            json!({ "left": 1, "op": "exists", "right": 1 }),
            "`exists` takes no `right`",
        ),
        (
            json!({ "left": 1, "op": "matches", "right": ".*" }),
            "unknown variant `matches`",
        ),
        (
            json!({ "left": 1, "op": "eq", "right": 1, "eval": "x" }),
            "unknown field `eval`",
        ),
        (
            json!({ "left": { "var": "env.HOME" }, "op": "exists" }),
            "starts with \"env\"",
        ),
        (
            json!({ "left": { "var": 3 }, "op": "exists" }),
            "`var` takes a path string",
        ),
        (
            json!({ "all": { "left": 1, "op": "exists" } }),
            "invalid type",
        ),
    ];
    for (json, expected) in cases {
        let err = serde_json::from_value::<Condition>(json.clone())
            .unwrap_err()
            .to_string();
        assert!(err.contains(expected), "{json}: {err}");
    }
}

#[test]
fn null_right_is_a_literal_and_objects_are_literals() {
    let c = parse(json!({ "left": { "a": 1, "var": "x" }, "op": "eq", "right": null }));
    let Condition::Compare { left, right, .. } = &c else {
        panic!("{c:?}")
    };
    assert_eq!(left, &Operand::Literal(json!({ "a": 1, "var": "x" })));
    assert_eq!(right, &Some(Operand::Literal(Value::Null)));
    // round trip
    assert_eq!(parse(serde_json::to_value(&c).unwrap()), c);
}

#[test]
fn depth_is_bounded_at_evaluation_too() {
    let mut json = json!({ "left": 1, "op": "eq", "right": 1 });
    for _ in 1..MAX_CONDITION_DEPTH {
        json = json!({ "not": { "not": json } });
    }
    // 1 + 2 * (MAX - 1) levels
    let deep = parse(json);
    let depth = 1 + 2 * (MAX_CONDITION_DEPTH - 1);
    assert_eq!(deep.depth(), depth);
    assert_eq!(
        deep.evaluate(&ctx()),
        Err(ConditionError::TooDeep { depth })
    );
    let mut ok = Condition::Compare {
        left: json!(1).into(),
        op: CompareOp::Exists,
        right: None,
    };
    for _ in 1..MAX_CONDITION_DEPTH {
        ok = Condition::All(vec![ok]);
    }
    assert_eq!(ok.depth(), MAX_CONDITION_DEPTH);
    assert_eq!(ok.evaluate(&ctx()), Ok(true));
}

#[test]
fn a_comparison_built_without_right_is_refused() {
    let c = Condition::Compare {
        left: json!(1).into(),
        op: CompareOp::Eq,
        right: None,
    };
    assert_eq!(
        c.evaluate(&ctx()),
        Err(ConditionError::MissingRight { op: CompareOp::Eq })
    );
}
