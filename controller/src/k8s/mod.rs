//! The thin Kubernetes shell around the compiler: watches and stores, the controller loop,
//! status writing, leader election and provisioning.

pub mod provision;
