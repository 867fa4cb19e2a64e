//! A variable read through its definition: the default when unset or
//! blank, the errors naming it, and its line of `--help`.

#![allow(clippy::unwrap_used)]

use std::time::Duration;

use outbox_env::{Flag, MAX_MILLIS, Text, Variable, Whole};

const BATCH: Whole = Whole {
    name: "TEST_BATCH_SIZE",
    default: 500,
    min: 1,
    max: 10_000,
    meaning: "rows per batch",
};

const TICK_MS: Whole = Whole {
    name: "TEST_TICK_MS",
    default: 1000,
    min: 100,
    max: MAX_MILLIS,
    meaning: "tick in ms",
};

const SWITCH: Flag = Flag {
    name: "TEST_SWITCH",
    default: false,
    meaning: "a switch",
};

const URL: Text = Text {
    name: "TEST_URL",
    default: "required",
    form: "a URL",
    meaning: "where to go",
};

/// A lookup holding `name=value` only.
fn one(name: &'static str, value: &'static str) -> impl Fn(&str) -> Option<String> {
    move |asked| (asked == name).then(|| value.to_owned())
}

#[test]
fn an_unset_or_blank_whole_number_is_its_default_and_a_set_one_is_trimmed() {
    assert_eq!(BATCH.read(&|_| None).unwrap(), 500);
    assert_eq!(BATCH.read(&one("TEST_BATCH_SIZE", "  ")).unwrap(), 500);
    assert_eq!(BATCH.read(&one("TEST_BATCH_SIZE", " 42 ")).unwrap(), 42);
    assert_eq!(
        TICK_MS.read_millis(&one("TEST_TICK_MS", "250")).unwrap(),
        Duration::from_millis(250)
    );
    let hours = Whole {
        default: 2,
        ..BATCH
    };
    assert_eq!(
        hours.read_hours(&|_| None).unwrap(),
        Duration::from_secs(7200)
    );
}

#[test]
fn a_bad_whole_number_is_refused_naming_the_variable_its_value_and_the_range() {
    let error = BATCH.read(&one("TEST_BATCH_SIZE", "lots")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid configuration: TEST_BATCH_SIZE=\"lots\": is not a whole number"
    );
    for (value, shown) in [("0", "\"0\""), ("10001", "\"10001\""), ("-1", "\"-1\"")] {
        let error = BATCH.read(&one("TEST_BATCH_SIZE", value)).unwrap_err();
        assert_eq!(error.variable, "TEST_BATCH_SIZE");
        assert!(error.to_string().contains(shown), "{error}");
    }
    let error = BATCH.read(&one("TEST_BATCH_SIZE", "0")).unwrap_err();
    assert_eq!(error.problem, "must be between 1 and 10000");
    let wide = Whole {
        max: u64::MAX,
        ..BATCH
    };
    let error = wide
        .read_as::<u8>(&one("TEST_BATCH_SIZE", "300"))
        .unwrap_err();
    assert_eq!(
        (error.value.as_str(), error.problem.as_str()),
        ("300", "is too large")
    );
}

#[test]
fn a_flag_takes_the_usual_words_either_way_and_refuses_others() {
    for word in ["true", "1", "yes", "ON"] {
        assert!(SWITCH.read(&one("TEST_SWITCH", word)).unwrap(), "{word}");
    }
    for word in ["false", "0", "no", " off "] {
        assert!(!SWITCH.read(&one("TEST_SWITCH", word)).unwrap(), "{word}");
    }
    assert!(!SWITCH.read(&|_| None).unwrap());
    let error = SWITCH.read(&one("TEST_SWITCH", "maybe")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid configuration: TEST_SWITCH=\"maybe\": must be true or false"
    );
}

#[test]
fn a_required_text_must_be_set_and_is_given_as_found() {
    let error = URL.required(&one("TEST_URL", " ")).unwrap_err();
    assert_eq!(
        error.to_string(),
        "invalid configuration: TEST_URL=\"\": is required"
    );
    assert_eq!(
        URL.required(&one("TEST_URL", " x ")).unwrap(),
        " x ",
        "parsing, trimming included, is the reader's"
    );
    assert_eq!(URL.read(&|_| None), None);
}

#[test]
fn the_help_line_states_meaning_values_and_default() {
    assert_eq!(
        Variable::from(BATCH).help(),
        "rows per batch [range: 1..=10000] [default: 500]"
    );
    assert_eq!(
        Variable::from(TICK_MS).help(),
        "tick in ms [range: at least 100] [default: 1000]"
    );
    assert_eq!(
        Variable::from(SWITCH).help(),
        "a switch [values: true, false] [default: false]"
    );
    assert_eq!(
        Variable::from(URL).help(),
        "where to go [values: a URL] [default: required]"
    );
    assert_eq!(Variable::from(BATCH).flag(), "test-batch-size");
    assert!(Variable::from(BATCH).default_in_range());
    let outside = Whole {
        default: 0,
        ..BATCH
    };
    assert!(!Variable::from(outside).default_in_range());
}
