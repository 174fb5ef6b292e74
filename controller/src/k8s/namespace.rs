//! The controller's own namespace (the leader-election Lease, the push CA Secret), made sure
//! of once at start, before anything is written in it.
//!
//! In: a client, the namespace's name, the limit of one API call. Out: [`Ensured`] (it
//! existed, it was created, or it may not be read), or a [`NamespaceError`] that says what to
//! do. Without this check a controller started against a fresh API server retried its Lease
//! in a namespace that did not exist, every renew period, for ever, and never led.
//!
//! A namespace that exists is never written: that needs only `get` on namespaces (which the
//! chart grants; it creates the namespace itself, `helm --create-namespace`). Only a missing
//! one is created, which needs `create`. A `get` that is forbidden tells nothing: the
//! controller goes on as it did before this check, and the Lease writes say the rest. A `get`
//! the API server does not answer (or answers with anything but 403/404) is asked again every
//! [`RETRY`], as the watches do: a controller started before its API server waits for it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::{Api, Client};
use tracing::{info, warn};

use super::reconcile::{CallError, bounded};

/// Pause before asking again after a `get` failed for a reason other than 403/404.
pub const RETRY: Duration = Duration::from_secs(2);

/// What [`ensure`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Ensured {
    /// The namespace was there.
    Existed,
    /// It was missing and this replica created it.
    Created,
    /// Reading it is forbidden: assumed to exist, as before this check.
    Unreadable,
}

/// Why the controller cannot run in its namespace.
#[derive(Debug, thiserror::Error)]
pub enum NamespaceError {
    /// The namespace is missing and creating it failed (`reason`: "forbidden", the API
    /// server's answer, or no answer in time).
    #[error(
        "namespace \"{name}\" does not exist and could not be created ({reason}): create it \
         with `kubectl create namespace {name}`, or pass --namespace with one that exists"
    )]
    Missing {
        /// The namespace.
        name: String,
        /// Why creating it failed.
        reason: String,
    },
}

/// Makes sure namespace `name` exists: reads it, and creates it when it is missing. Each API
/// call is bounded by `limit`.
pub async fn ensure(
    client: &Client,
    name: &str,
    limit: Duration,
) -> Result<Ensured, NamespaceError> {
    let api: Api<Namespace> = Api::all(client.clone());
    loop {
        match bounded(limit, api.get_opt(name)).await {
            Ok(Some(_)) => return Ok(Ensured::Existed),
            Ok(None) => return create(&api, name, limit).await,
            Err(CallError::Failed(kube::Error::Api(s))) if s.is_forbidden() => {
                info!(
                    namespace = name,
                    "may not read our namespace: assuming it exists"
                );
                return Ok(Ensured::Unreadable);
            }
            Err(e) => {
                warn!(namespace = name, error = %e, "cannot read our namespace; asking again");
                tokio::time::sleep(RETRY).await;
            }
        }
    }
}

/// Creates the missing namespace `name`; one created meanwhile (another replica) will do.
async fn create(
    api: &Api<Namespace>,
    name: &str,
    limit: Duration,
) -> Result<Ensured, NamespaceError> {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.to_owned()),
            ..ObjectMeta::default()
        },
        ..Namespace::default()
    };
    let reason = match bounded(limit, api.create(&PostParams::default(), &ns)).await {
        Ok(_) => {
            info!(
                namespace = name,
                "created our namespace, which did not exist"
            );
            return Ok(Ensured::Created);
        }
        Err(CallError::Failed(kube::Error::Api(s))) if s.is_already_exists() => {
            return Ok(Ensured::Existed);
        }
        Err(CallError::Failed(kube::Error::Api(s))) if s.is_forbidden() => "forbidden".to_owned(),
        Err(CallError::Failed(kube::Error::Api(s))) => {
            format!("{} {}: {}", s.code, s.reason, s.message)
        }
        Err(e) => e.to_string(),
    };
    Err(NamespaceError::Missing {
        name: name.to_owned(),
        reason,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_error_says_what_to_do() {
        let e = NamespaceError::Missing {
            name: "tollgate-system".to_owned(),
            reason: "forbidden".to_owned(),
        };
        assert_eq!(
            e.to_string(),
            "namespace \"tollgate-system\" does not exist and could not be created (forbidden): \
             create it with `kubectl create namespace tollgate-system`, or pass --namespace \
             with one that exists"
        );
    }
}
