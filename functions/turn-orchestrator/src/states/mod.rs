//! One module per state: the effects a step of that state has (the calls it makes, what it
//! appends and emits), ending in an [`crate::fsm::Outcome`].

pub(crate) mod approval;
pub(crate) mod calls;
pub(crate) mod execute;
pub(crate) mod provisioning;
pub(crate) mod steering;
pub(crate) mod streaming;
