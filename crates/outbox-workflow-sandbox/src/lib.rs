//! The `code` block's sandbox: user JavaScript run by an embedded QuickJS
//! engine, with limits, on a blocking thread.
//!
//! [`run`] makes a fresh engine for each call (nothing survives between
//! blocks or runs) and runs the block's `source` as the body of a function
//! `(input, vars, blocks) => { source }`. Its arguments are the runner's
//! context `{ "input", "vars", "blocks": { "<id>": { "output" } } }`, handed
//! over as JSON text and parsed by the engine; the function's return value,
//! turned into JSON text by the engine's `JSON.stringify`, is the block's
//! output (`undefined` is `null`). Data never becomes part of the source.
//!
//! What the code has: the standard ECMAScript built-ins of QuickJS's full
//! context (`Object`, `Array`, `String`, `Math`, `JSON`, `Date`, `RegExp`,
//! `Map`/`Set`, `Promise`, typed arrays, `Proxy`, …, plus `atob`/`btoa` and
//! `performance.now`). None of them reaches outside the engine: there is no
//! `require`, no module loader (`import()` never resolves), no `fetch`,
//! `console`, `process`, timers, file or network access (those live in
//! QuickJS's separate libc layer, which is not used), and `Atomics.wait`
//! refuses to block. The code can compute, and nothing more. The full
//! context is used because the base one has no `JSON`, and a hand-picked
//! subset is a configuration the engine is not tested in (an `async`
//! function without the `Promise` built-in leaks objects and aborts the
//! engine's teardown).
//!
//! The function runs synchronously: a returned promise is an error, and
//! promise callbacks never run. The result goes through `JSON.stringify`,
//! so members without a JSON form are left out and a `Map` becomes `{}`.
//!
//! Limits: [`MEMORY_LIMIT`] of engine memory (the parsed context counts),
//! [`STACK_LIMIT`] of stack, and [`TIME_LIMIT`] from the start of the call,
//! enforced by the engine's interrupt handler, which stops even an endless
//! loop. Each is an error of the block, never a panic of the worker.
//!
//! [`QuickJs`] is this sandbox as the runner's [`CodeSandbox`]: the
//! bridge's binary makes its runner with it. This crate is the only one
//! that compiles the engine; it knows nothing of runs, leases or the
//! database.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rquickjs::{
    CatchResultExt, CaughtError, Coerced, Constructor, Context, Ctx, Function, Runtime, Value,
};

use outbox_workflow_model::CodeParams;
use outbox_workflow_runner::{CodeRun, CodeSandbox};

/// The most memory one run's engine may allocate: 32 MiB.
pub const MEMORY_LIMIT: usize = 32 * 1024 * 1024;

/// The most stack the code may use: 512 KiB (deep recursion is a
/// `RangeError` the code can catch, not a crash).
pub const STACK_LIMIT: usize = 512 * 1024;

/// How long one run may take: 2 s, wall clock from the start of the call.
pub const TIME_LIMIT: Duration = Duration::from_secs(2);

/// The longest description of a thrown value kept in a [`CodeError`], in
/// characters; a longer one is cut and ends with `…`.
pub const MAX_MESSAGE_CHARS: usize = 1000;

/// Why a `code` block did not produce an output. The runner records the
/// message ([`Display`](std::fmt::Display)) as the block's error.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CodeError {
    /// The source is not a valid function body.
    #[error("the code does not compile: {0}")]
    Compile(String),
    /// The code threw: the exception as `Name: message`, or the thrown
    /// value when it is not an error object.
    #[error("the code threw {0}")]
    Thrown(String),
    /// The returned value has no JSON form: a function, a symbol, a cycle,
    /// a `BigInt`.
    #[error("the code's result is not JSON: {0}")]
    NotJson(String),
    /// The run passed [`TIME_LIMIT`].
    #[error("code ran longer than {} s", TIME_LIMIT.as_secs())]
    Deadline,
    /// The run needed more than [`MEMORY_LIMIT`].
    #[error("code used more than {} MiB of memory", MEMORY_LIMIT / (1024 * 1024))]
    OutOfMemory,
    /// The engine could not be set up or failed on its own (not the code's
    /// doing).
    #[error("the code sandbox failed: {0}")]
    Sandbox(String),
}

/// This sandbox for a bridge runner
/// ([`Runner::with_bridge_blocks`](outbox_workflow_runner::Runner::with_bridge_blocks)):
/// [`run`] with [`TIME_LIMIT`], its errors recorded by their message.
///
/// ```
/// use std::sync::Arc;
/// use outbox_workflow_runner::Runner;
/// use outbox_workflow_sandbox::QuickJs;
///
/// let bridge_runner = Runner::new().unwrap().with_bridge_blocks(Arc::new(QuickJs));
/// # drop(bridge_runner);
/// ```
#[derive(Debug, Clone, Copy, Default)]
pub struct QuickJs;

impl CodeSandbox for QuickJs {
    fn time_limit(&self) -> Duration {
        TIME_LIMIT
    }

    fn run<'a>(&'a self, params: &'a CodeParams, ctx: &'a serde_json::Value) -> CodeRun<'a> {
        Box::pin(async move { run(params, ctx).await.map_err(|e| e.to_string()) })
    }
}

/// Runs a `code` block: `params.source` as the body of a function of
/// `input`, `vars` and `blocks`, taken from `ctx` (the runner's context
/// object). Returns what the function returns, as JSON (`undefined` →
/// `null`).
///
/// Runs on a blocking thread ([`tokio::task::spawn_blocking`]) with the
/// module's limits.
///
/// # Errors
///
/// [`CodeError`]: the source does not compile, the code threw, its result
/// is not JSON, or a limit was hit.
pub async fn run(
    params: &CodeParams,
    ctx: &serde_json::Value,
) -> Result<serde_json::Value, CodeError> {
    let source = params.source.clone();
    let context = serde_json::to_string(ctx).map_err(|e| CodeError::Sandbox(e.to_string()))?;
    tokio::task::spawn_blocking(move || run_blocking(&source, &context))
        .await
        .map_err(|e| CodeError::Sandbox(e.to_string()))?
}

/// [`run`] on the calling thread: `context` is the context as JSON text.
fn run_blocking(source: &str, context: &str) -> Result<serde_json::Value, CodeError> {
    let sandbox = |e: rquickjs::Error| CodeError::Sandbox(e.to_string());
    let runtime = Runtime::new().map_err(sandbox)?;
    runtime.set_memory_limit(MEMORY_LIMIT);
    runtime.set_max_stack_size(STACK_LIMIT);
    let deadline = Instant::now() + TIME_LIMIT;
    let timed_out = Arc::new(AtomicBool::new(false));
    let flag = Arc::clone(&timed_out);
    runtime.set_interrupt_handler(Some(Box::new(move || {
        let late = Instant::now() >= deadline;
        if late {
            flag.store(true, Ordering::Relaxed);
        }
        late
    })));
    let engine = Context::full(&runtime).map_err(|e| match e {
        rquickjs::Error::Allocation => CodeError::OutOfMemory,
        e => sandbox(e),
    })?;
    let text = engine.with(|ctx| evaluate(&ctx, source, context));
    // An interrupted run fails with whatever the engine threw last; the
    // deadline is the reason.
    let text = text.map_err(|e| {
        if timed_out.load(Ordering::Relaxed) {
            CodeError::Deadline
        } else {
            e
        }
    })?;
    serde_json::from_str(&text).map_err(|e| CodeError::NotJson(e.to_string()))
}

/// Compiles the source, calls it with the parsed context, and gives the
/// result's JSON text.
fn evaluate<'js>(ctx: &Ctx<'js>, source: &str, context: &str) -> Result<String, CodeError> {
    let fail =
        |wrap: fn(String) -> CodeError| move |caught: CaughtError<'js>| classify(ctx, caught, wrap);
    let function_ctor: Constructor = ctx
        .globals()
        .get("Function")
        .catch(ctx)
        .map_err(fail(CodeError::Sandbox))?;
    let body: Function = function_ctor
        .construct(("input", "vars", "blocks", source))
        .catch(ctx)
        .map_err(fail(CodeError::Compile))?;
    let args = ctx
        .json_parse(context)
        .catch(ctx)
        .map_err(fail(CodeError::Sandbox))?;
    let args = args
        .as_object()
        .ok_or_else(|| CodeError::Sandbox("the context is not an object".into()))?;
    let part = |name: &str| -> Result<Value<'js>, CodeError> {
        args.get(name).catch(ctx).map_err(fail(CodeError::Sandbox))
    };
    let (input, vars, blocks) = (part("input")?, part("vars")?, part("blocks")?);
    let result: Value = body
        .call((input, vars, blocks))
        .catch(ctx)
        .map_err(fail(CodeError::Thrown))?;
    if result.is_undefined() {
        return Ok("null".to_owned());
    }
    if result.is_promise() {
        return Err(CodeError::NotJson(
            "a promise (the code runs synchronously; promises are not awaited)".into(),
        ));
    }
    let kind = type_name(&result);
    let text = ctx
        .json_stringify(result)
        .catch(ctx)
        .map_err(fail(CodeError::NotJson))?;
    let text = text.ok_or_else(|| CodeError::NotJson(kind.into()))?;
    text.to_string()
        .map_err(|e| CodeError::Sandbox(e.to_string()))
}

/// What a value without a JSON form is, for the error.
fn type_name(value: &Value<'_>) -> &'static str {
    if value.is_function() {
        "a function"
    } else if value.is_symbol() {
        "a symbol"
    } else {
        value.type_name()
    }
}

/// A caught exception as a [`CodeError`]: out of memory, or `wrap` of its
/// description.
fn classify<'js>(
    ctx: &Ctx<'js>,
    caught: CaughtError<'js>,
    wrap: fn(String) -> CodeError,
) -> CodeError {
    let text = match caught {
        CaughtError::Error(rquickjs::Error::Allocation) => return CodeError::OutOfMemory,
        CaughtError::Error(error) => return CodeError::Sandbox(error.to_string()),
        CaughtError::Exception(exception) => {
            let object = exception.as_object();
            let name = object
                .get::<_, Option<Coerced<String>>>("name")
                .ok()
                .flatten()
                .map_or_else(|| "Error".to_owned(), |n| n.0);
            let message = exception.message().unwrap_or_default();
            if name == "InternalError" && message == "out of memory" {
                return CodeError::OutOfMemory;
            }
            if message.is_empty() {
                name
            } else {
                format!("{name}: {message}")
            }
        }
        CaughtError::Value(value) => match value.as_string() {
            Some(text) => text.to_string().unwrap_or_default(),
            None => ctx
                .json_stringify(value.clone())
                .ok()
                .flatten()
                .and_then(|s| s.to_string().ok())
                .unwrap_or_else(|| type_name(&value).to_owned()),
        },
    };
    wrap(match text.char_indices().nth(MAX_MESSAGE_CHARS) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text,
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use serde_json::{Value, json};

    use super::{CodeError, run};
    use outbox_workflow_model::{CodeLanguage, CodeParams};

    async fn eval(source: &str) -> Result<Value, CodeError> {
        let params = CodeParams {
            language: CodeLanguage::Javascript,
            source: source.to_owned(),
        };
        let ctx = json!({
            "input": { "items": [1, 2, 3], "text": "a\"b'c`${x}</script>\u{0}" },
            "vars": { "name": "ada" },
            "blocks": { "start": { "output": { "n": 7 } } }
        });
        run(&params, &ctx).await
    }

    #[tokio::test]
    async fn the_function_reads_input_vars_and_blocks_and_its_result_is_the_output() {
        let out = eval(
            "return { total: input.items.reduce((a, b) => a + b, 0), who: vars.name ?? null, \
             n: blocks.start.output.n, text: input.text }",
        )
        .await
        .unwrap();
        assert_eq!(
            out,
            json!({ "total": 6, "who": "ada", "n": 7, "text": "a\"b'c`${x}</script>\u{0}" })
        );
    }

    #[tokio::test]
    async fn undefined_is_null_and_json_values_pass_through() {
        assert_eq!(eval("return undefined").await.unwrap(), Value::Null);
        assert_eq!(eval("let x = 1;").await.unwrap(), Value::Null);
        assert_eq!(
            eval("return [1, 'a', true, null, 1.5]").await.unwrap(),
            json!([1, "a", true, null, 1.5])
        );
        // Members without a JSON form are left out, as JSON.stringify does.
        assert_eq!(
            eval("return { f() {}, a: 1 }").await.unwrap(),
            json!({ "a": 1 })
        );
    }

    #[tokio::test]
    async fn a_result_without_json_form_is_an_error() {
        for (source, expected) in [
            ("return () => 1", "a function"),
            ("return Symbol('x')", "a symbol"),
            ("const a = {}; a.self = a; return a", "circular"),
            ("return 10n", "BigInt"),
        ] {
            let error = eval(source).await.unwrap_err();
            assert!(
                matches!(error, CodeError::NotJson(_)),
                "{source}: {error:?}"
            );
            assert!(error.to_string().contains(expected), "{source}: {error}");
        }
    }

    #[tokio::test]
    async fn a_thrown_exception_is_an_error_with_its_message() {
        let error = eval("throw new TypeError('no total')").await.unwrap_err();
        assert_eq!(error.to_string(), "the code threw TypeError: no total");
        let error = eval("throw 'plain text'").await.unwrap_err();
        assert_eq!(error, CodeError::Thrown("plain text".into()));
        let error = eval("throw { code: 1 }").await.unwrap_err();
        assert_eq!(error, CodeError::Thrown(r#"{"code":1}"#.into()));
        let error = eval("return }) (").await.unwrap_err();
        assert!(
            matches!(error, CodeError::Compile(ref m) if m.starts_with("SyntaxError")),
            "{error:?}"
        );
    }

    #[tokio::test]
    async fn a_hostile_error_still_gives_a_short_reason() {
        let error = eval("throw new Error('x'.repeat(100000))")
            .await
            .unwrap_err();
        let CodeError::Thrown(text) = error else {
            panic!("{error:?}")
        };
        assert_eq!(text.chars().count(), super::MAX_MESSAGE_CHARS + 1);
        assert!(
            text.starts_with("Error: xxx") && text.ends_with('…'),
            "{text}"
        );
        let error = eval(
            "const e = new Error('m'); \
             Object.defineProperty(e, 'name', { get() { throw new Error('no name') } }); throw e",
        )
        .await
        .unwrap_err();
        assert_eq!(error, CodeError::Thrown("Error: m".into()));
        let error = eval(
            "const e = new Error('m'); \
             Object.defineProperty(e, 'name', { get() { while (true) {} } }); throw e",
        )
        .await
        .unwrap_err();
        assert_eq!(error, CodeError::Deadline);
    }

    #[tokio::test]
    async fn there_is_no_require_fetch_timer_console_or_process() {
        for name in [
            "require",
            "fetch",
            "XMLHttpRequest",
            "setTimeout",
            "setInterval",
            "console",
            "process",
            "std",
            "os",
        ] {
            let error = eval(&format!("return {name}")).await.unwrap_err();
            assert_eq!(
                error,
                CodeError::Thrown(format!("ReferenceError: {name} is not defined")),
            );
        }
        let error = eval("return require('fs').readFileSync('/etc/passwd')")
            .await
            .unwrap_err();
        assert_eq!(
            error.to_string(),
            "the code threw ReferenceError: require is not defined"
        );
        // No module loader: `import()` is a promise that never resolves.
        let error = eval("return import('fs')").await.unwrap_err();
        assert!(error.to_string().contains("promise"), "{error}");
        let error = eval("return Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0)")
            .await
            .unwrap_err();
        assert_eq!(
            error,
            CodeError::Thrown("TypeError: cannot block in this thread".into())
        );
    }

    #[tokio::test]
    async fn the_standard_built_ins_are_there() {
        let out = eval(
            "return [JSON.stringify({ a: 1 }), 'a-b'.replace(/-/, '+'), \
             new Date(0).toISOString(), new Map([[1, 2]]).size]",
        )
        .await
        .unwrap();
        assert_eq!(
            out,
            json!(["{\"a\":1}", "a+b", "1970-01-01T00:00:00.000Z", 1])
        );
    }

    #[tokio::test]
    async fn a_promise_is_not_awaited() {
        let error = eval("return Promise.resolve(1)").await.unwrap_err();
        assert!(matches!(error, CodeError::NotJson(_)), "{error:?}");
        let error = eval("return (async () => 1)()").await.unwrap_err();
        assert!(matches!(error, CodeError::NotJson(_)), "{error:?}");
        // A callback queued by the code never runs: the result is already in.
        assert_eq!(
            eval("Promise.resolve().then(() => { while (true) {} }); return 1")
                .await
                .unwrap(),
            json!(1)
        );
    }

    #[tokio::test]
    async fn each_run_has_a_fresh_engine() {
        assert_eq!(
            eval("globalThis.leak = 1; return 1").await.unwrap(),
            json!(1)
        );
        assert_eq!(
            eval("return typeof leak").await.unwrap(),
            json!("undefined")
        );
    }

    #[tokio::test]
    async fn memory_and_stack_are_limited() {
        let error = eval("return 'x'.repeat(1 << 29).length").await.unwrap_err();
        assert_eq!(error, CodeError::OutOfMemory);
        let error = eval("const a = []; while (true) a.push(new Array(100000).fill(1.5));")
            .await
            .unwrap_err();
        assert_eq!(error.to_string(), "code used more than 32 MiB of memory");
        let error = eval("function f(n) { return f(n + 1) + 1 } return f(0)")
            .await
            .unwrap_err();
        assert_eq!(
            error,
            CodeError::Thrown("RangeError: Maximum call stack size exceeded".into())
        );
        let error = eval("return new ArrayBuffer(1 << 30)").await.unwrap_err();
        assert_eq!(error, CodeError::OutOfMemory);
    }

    #[tokio::test]
    async fn an_endless_loop_stops_at_the_deadline_even_inside_try() {
        let error = eval("try { while (true) {} } catch (e) { return 'caught' }")
            .await
            .unwrap_err();
        assert_eq!(error, CodeError::Deadline);
        assert_eq!(error.to_string(), "code ran longer than 2 s");
    }

    #[tokio::test]
    async fn a_backtracking_regexp_stops_at_the_deadline() {
        let error = eval("return /(a+)+b/.test('a'.repeat(40))")
            .await
            .unwrap_err();
        assert_eq!(error, CodeError::Deadline);
    }
}
