//! barrier: no rank leaves until every rank has entered.

pub mod dissemination;
