//! Parameters of the blocks that steer the run or keep state: `if`,
//! `switch`, `waitForInput`, `log`, `variable`.

use serde::{Deserialize, Serialize};

use super::{ParamError, Params, ensure};
use crate::names::{is_block_id, is_identifier};
use crate::{Condition, Operand, TextTemplate, VarPath, labels};

/// The longest `waitForInput` timeout: 30 days.
pub const MAX_WAIT_TIMEOUT_MS: u64 = 30 * 24 * 60 * 60 * 1000;

/// `if`: takes output `true` when the condition holds, `false` otherwise.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct IfParams {
    /// The condition.
    pub condition: Condition,
}

impl Params for IfParams {
    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(
            self.condition
                .operands()
                .into_iter()
                .filter_map(Operand::path),
        );
    }
}

/// `switch`: takes the output of the first case whose condition holds, or
/// `default` when none does. `default` is always an output; leaving it
/// unconnected ends the run there.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SwitchParams {
    /// The cases, tried in order; at least one.
    pub cases: Vec<SwitchCase>,
}

/// One case of a `switch`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct SwitchCase {
    /// The output label of the case: 1 to 64 ASCII letters, digits, `_` or
    /// `-`; unique within the switch, and not `default`.
    pub label: String,
    /// When the case is taken.
    pub condition: Condition,
}

impl Params for SwitchParams {
    fn check(&self) -> Result<(), ParamError> {
        ensure(
            !self.cases.is_empty(),
            "cases",
            "a switch needs at least one case",
        )?;
        for (i, case) in self.cases.iter().enumerate() {
            let field = format!("cases[{i}].label");
            ensure(
                is_block_id(&case.label),
                &field,
                format!(
                    "{:?} is not a label (1 to 64 ASCII letters, digits, `_` or `-`)",
                    case.label
                ),
            )?;
            ensure(
                case.label != labels::DEFAULT,
                &field,
                "`default` is the switch's own output for no match",
            )?;
            if let Some(first) = self.cases[..i].iter().position(|c| c.label == case.label) {
                return Err(ParamError::new(
                    field,
                    format!("label {:?} is already case {first}'s", case.label),
                ));
            }
        }
        Ok(())
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        for case in &self.cases {
            out.extend(
                case.condition
                    .operands()
                    .into_iter()
                    .filter_map(Operand::path),
            );
        }
    }
}

/// `waitForInput`: suspends the run until an answer arrives (output
/// `input`; the answer is the block's output) or, when `timeoutMs` is set,
/// until it passes (output `timeout`, which exists only then).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct WaitForInputParams {
    /// What the person is asked.
    pub prompt: TextTemplate,
    /// How long to wait, 1 ms to 30 days ([`MAX_WAIT_TIMEOUT_MS`]); `None`
    /// waits for ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_ms: Option<u64>,
}

impl Params for WaitForInputParams {
    fn check(&self) -> Result<(), ParamError> {
        match self.timeout_ms {
            Some(ms) => ensure(
                (1..=MAX_WAIT_TIMEOUT_MS).contains(&ms),
                "timeoutMs",
                format!("{ms} is outside 1..={MAX_WAIT_TIMEOUT_MS} (30 days)"),
            ),
            None => Ok(()),
        }
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.prompt.placeholders());
    }
}

/// The level of a `log` line.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum LogLevel {
    /// `debug`.
    Debug,
    /// `info` (the default).
    #[default]
    Info,
    /// `warn`.
    Warn,
    /// `error`: a line, not a failure; the run goes on.
    Error,
}

/// `log`: writes a line to the execution's log. Output: the rendered
/// message.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LogParams {
    /// The line.
    pub message: TextTemplate,
    /// Its level; `info` when absent.
    #[serde(default)]
    pub level: LogLevel,
}

impl Params for LogParams {
    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.message.placeholders());
    }
}

/// `variable`: sets `vars.<name>` for the blocks after it. Output: the value.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VariableParams {
    /// The variable: an identifier.
    pub name: String,
    /// Its value.
    pub value: Operand,
}

impl Params for VariableParams {
    fn check(&self) -> Result<(), ParamError> {
        ensure(
            is_identifier(&self.name),
            "name",
            format!(
                "{:?} is not a variable name (a letter or `_`, then letters, digits or `_`, 64 at most)",
                self.name
            ),
        )
    }

    fn paths<'a>(&'a self, out: &mut Vec<&'a VarPath>) {
        out.extend(self.value.path());
    }
}
