//! The agent's one client of the API server, shared by the node writer and
//! the pod listing.

use super::KubeError;
use super::settings::{ApiSettings, KubeSettings};
use std::time::Duration;

/// The agent's client of the API server: built once and handed to the node
/// writer ([`NodeWriter::start`](crate::NodeWriter::start)) and the pod
/// listing ([`PodListing::start`](crate::PodListing::start)), which then
/// share its connections. A dry run's ([`KubeClient::dry_run`]) has none:
/// the writer works against an in-memory Node and no pods are listed.
#[derive(Clone)]
pub struct KubeClient(Option<kube::Client>);

impl std::fmt::Debug for KubeClient {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClient")
            .field("dry_run", &self.is_dry_run())
            .finish()
    }
}

impl KubeClient {
    /// Builds the client from the `[kube]` settings: `api_server_url`, else
    /// the in-cluster service account, else a kubeconfig. Nothing is sent
    /// yet: an unreachable API server is not an error here.
    pub async fn connect(settings: &KubeSettings) -> Result<KubeClient, KubeError> {
        Ok(KubeClient(Some(build_client(&settings.api).await?)))
    }

    /// The client of a dry run (`--kube-dry-run`): nothing is sent.
    pub fn dry_run() -> KubeClient {
        KubeClient(None)
    }

    /// Whether this is [`KubeClient::dry_run`]'s.
    pub fn is_dry_run(&self) -> bool {
        self.0.is_none()
    }

    /// The client; `None` in a dry run.
    pub(crate) fn client(&self) -> Option<&kube::Client> {
        self.0.as_ref()
    }
}

pub(crate) async fn build_client(api: &ApiSettings) -> Result<kube::Client, KubeError> {
    gpuwatch_core::install_crypto_provider();
    let mut config = match &api.server_url {
        Some(url) => {
            let uri = url.parse::<http::Uri>().map_err(|e| KubeError::Url {
                url: url.clone(),
                reason: e.to_string(),
            })?;
            kube::Config::new(uri)
        }
        None => kube::Config::infer().await.map_err(KubeError::Infer)?,
    };
    config.connect_timeout = Some(api.request_timeout);
    // The client's own retry of 429/503/504 (up to 15 tries, unjittered)
    // is off: every caller here retries with its own jittered backoff and
    // must see the server's answer, not a timeout that hides retries (the
    // quarantine budget fails open on refusals and unanswered claims, the
    // pod listing tells the engine it is unavailable).
    config.default_retry = false;
    // Watches hold the connection open up to watch_timeout_secs.
    config.read_timeout =
        Some(Duration::from_secs(u64::from(api.watch_timeout_secs)) + api.request_timeout);
    kube::Client::try_from(config).map_err(KubeError::Client)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// rustls cannot pick a crypto provider by itself in this build (ring and
    /// aws-lc-rs are both compiled in) and the kube client's TLS config uses
    /// the process-wide one: building a client installs it first, whichever
    /// path (the agent, `node-cleanup`) builds it.
    #[tokio::test]
    async fn building_a_client_installs_the_crypto_provider() {
        let mut api = KubeSettings::default().api;
        api.server_url = Some("https://127.0.0.1:1".into());
        build_client(&api).await.expect("a client for an https URL");
        assert!(rustls::crypto::CryptoProvider::get_default().is_some());
    }
}
