//! [`AlgorithmOverrides`]: the algorithms a user forces per operation (`OXCCL_ALGO`), and the
//! error for an algorithm that cannot run an operation.

use super::Algorithm;
use crate::error::Error;
use crate::op_kind::OpKind;

/// Algorithm overrides: one for every operation, and/or one per operation.
///
/// Parsed from `OXCCL_ALGO`, either a single name (`ring`: used by every operation it applies
/// to, the others keep choosing automatically) or a comma-separated list of `op:algorithm`
/// pairs (`all_reduce:rabenseifner,all_gather:bruck`), optionally mixed with one bare name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct AlgorithmOverrides {
    global: Option<Algorithm>,
    per_op: Vec<(OpKind, Algorithm)>,
}

impl AlgorithmOverrides {
    /// No overrides: every operation chooses automatically.
    pub fn none() -> Self {
        Self::default()
    }

    /// Use `algo` for every operation it applies to.
    pub fn global(algo: Algorithm) -> Self {
        AlgorithmOverrides { global: Some(algo), per_op: Vec::new() }
    }

    /// Use `algo` for `op`.
    ///
    /// # Errors
    /// [`Error::InvalidArgument`] when `algo` cannot run `op`.
    pub fn set(&mut self, op: OpKind, algo: Algorithm) -> Result<(), Error> {
        if !algo.applies_to(op) {
            return Err(not_applicable(op, algo));
        }
        self.per_op.retain(|(o, _)| *o != op);
        self.per_op.push((op, algo));
        Ok(())
    }

    /// The override in force for `op` (`Auto` when there is none).
    pub fn for_op(&self, op: OpKind) -> Algorithm {
        if let Some((_, a)) = self.per_op.iter().find(|(o, _)| *o == op) {
            return *a;
        }
        match self.global {
            Some(a) if a.applies_to(op) => a,
            _ => Algorithm::Auto,
        }
    }

    /// Parses the `OXCCL_ALGO` syntax described on the type.
    ///
    /// # Errors
    /// [`Error::Config`] naming the unknown operation or algorithm, or the pair that does not apply.
    pub fn parse(s: &str) -> Result<Self, Error> {
        let mut out = AlgorithmOverrides::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            match part.split_once(':') {
                None => {
                    let a = part.parse::<Algorithm>().map_err(|e| Error::Config(e.to_string()))?;
                    out.global = Some(a);
                }
                Some((op, algo)) => {
                    let op_norm = op.trim().to_ascii_lowercase().replace('-', "_");
                    let kind = OpKind::ALL
                        .into_iter()
                        .find(|k| k.name() == op_norm)
                        .ok_or_else(|| Error::Config(format!("unknown operation `{op}` in `{part}`")))?;
                    let a = algo.parse::<Algorithm>().map_err(|e| Error::Config(e.to_string()))?;
                    out.set(kind, a).map_err(|e| Error::Config(e.to_string()))?;
                }
            }
        }
        Ok(out)
    }
}

pub(crate) fn not_applicable(op: OpKind, algo: Algorithm) -> Error {
    let mut names: Vec<_> = Algorithm::for_op(op).iter().map(|a| a.name()).collect();
    if Algorithm::SharedMemory.applies_to(op) {
        names.push("shared_memory (cpu backend, one host)");
    }
    Error::invalid(format!("algorithm `{algo}` cannot run {op}; {op} supports: auto, {}", names.join(", ")))
}
