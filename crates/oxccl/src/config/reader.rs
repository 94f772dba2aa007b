//! Reading settings: the builder's values first, then the environment, each checked against
//! the registry, with errors that name the variable and say where its value came from.

use std::collections::BTreeMap;
use std::time::Duration;

use super::parse;
use super::registry::{self, Setting};
use crate::error::{Error, Result};

/// Where a setting's value came from, for error messages.
pub(super) fn origin(s: &Setting, value: &str, from_builder: bool) -> String {
    if from_builder {
        format!("{}={value:?} (set with Config)", s.name)
    } else {
        format!("{}={value:?}", s.name)
    }
}

/// Reads settings: the builder's values first, then the environment.
pub(super) struct Reader<'a, E: Fn(&str) -> Option<String>> {
    pub(super) builder: &'a BTreeMap<&'static str, String>,
    pub(super) env: E,
}

impl<E: Fn(&str) -> Option<String>> Reader<'_, E> {
    /// The text of `s` and whether the builder gave it; an empty variable is unset.
    pub(super) fn raw(&self, s: &Setting) -> Option<(String, bool)> {
        if let Some(v) = self.builder.get(s.name) {
            return Some((v.clone(), true));
        }
        (self.env)(s.name).filter(|v| !v.trim().is_empty()).map(|v| (v, false))
    }

    /// `s` checked against its kind and converted, or `None` when unset.
    pub(super) fn get<T>(
        &self,
        s: &Setting,
        conv: impl Fn(&str) -> std::result::Result<T, String>,
    ) -> Result<Option<T>> {
        match self.raw(s) {
            None => Ok(None),
            Some((v, b)) => s
                .check(&v)
                .and_then(|()| conv(&v))
                .map(Some)
                .map_err(|why| Error::Config(format!("{}: {why}", origin(s, &v, b)))),
        }
    }

    /// Like `get`, with the registry's default when unset.
    pub(super) fn or_default<T>(
        &self,
        s: &Setting,
        conv: impl Fn(&str) -> std::result::Result<T, String>,
    ) -> Result<T> {
        match self.get(s, &conv)? {
            Some(v) => Ok(v),
            None => {
                conv(s.default).map_err(|why| Error::Internal(format!("the default of {} is unusable: {why}", s.name)))
            }
        }
    }
}

pub(super) fn choice(s: &'static Setting) -> impl Fn(&str) -> std::result::Result<&'static str, String> {
    move |v| match s.kind {
        registry::Kind::Choice(c) => parse::choice(v, c),
        _ => Err(format!("{} is not a choice (internal error)", s.name)),
    }
}

pub(super) fn size(v: &str) -> std::result::Result<usize, String> {
    parse::size(v)
}

pub(super) fn micros(v: &str) -> std::result::Result<Duration, String> {
    v.trim().parse::<u64>().map(Duration::from_micros).map_err(|e| e.to_string())
}

pub(super) fn text(v: &str) -> std::result::Result<String, String> {
    Ok(v.trim().to_string())
}
