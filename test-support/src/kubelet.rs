//! A kubelet PodResources server on a unix socket, generated (in
//! gpuwatch-proto) from the kubelet's own `api.proto`, in the same file as
//! the agent's client.
//! It answers `List` with what the test set (the only call the agent makes),
//! `Get` from the same pods (an error for a pod it does not have), and
//! `GetAllocatableResources` with every device the pods hold.

pub use gpuwatch_proto::podresources as v1;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use v1::pod_resources_lister_server::{PodResourcesLister, PodResourcesListerServer};

/// One container's devices: (resource name, device ids).
pub type Devices = Vec<(String, Vec<String>)>;

/// A pod as the kubelet lists it: namespace, name, and (container, devices).
#[derive(Debug, Clone)]
pub struct PodDevices {
    pub namespace: String,
    pub name: String,
    pub containers: Vec<(String, Devices)>,
}

#[derive(Default, Clone)]
struct Lister {
    pods: Arc<Mutex<Vec<PodDevices>>>,
    calls: Arc<Mutex<usize>>,
}

fn to_proto(p: &PodDevices) -> v1::PodResources {
    v1::PodResources {
        name: p.name.clone(),
        namespace: p.namespace.clone(),
        containers: p
            .containers
            .iter()
            .map(|(name, devices)| v1::ContainerResources {
                name: name.clone(),
                devices: devices
                    .iter()
                    .map(|(resource, ids)| v1::ContainerDevices {
                        resource_name: resource.clone(),
                        device_ids: ids.clone(),
                        topology: None,
                    })
                    .collect(),
                ..Default::default()
            })
            .collect(),
    }
}

#[tonic::async_trait]
impl PodResourcesLister for Lister {
    async fn list(
        &self,
        _: tonic::Request<v1::ListPodResourcesRequest>,
    ) -> Result<tonic::Response<v1::ListPodResourcesResponse>, tonic::Status> {
        *self.calls.lock().expect("lock") += 1;
        let pods = self.pods.lock().expect("lock");
        Ok(tonic::Response::new(v1::ListPodResourcesResponse {
            pod_resources: pods.iter().map(to_proto).collect(),
        }))
    }

    async fn get_allocatable_resources(
        &self,
        _: tonic::Request<v1::AllocatableResourcesRequest>,
    ) -> Result<tonic::Response<v1::AllocatableResourcesResponse>, tonic::Status> {
        let pods = self.pods.lock().expect("lock");
        let devices = pods
            .iter()
            .flat_map(|p| to_proto(p).containers)
            .flat_map(|c| c.devices)
            .collect();
        Ok(tonic::Response::new(v1::AllocatableResourcesResponse {
            devices,
            ..Default::default()
        }))
    }

    async fn get(
        &self,
        req: tonic::Request<v1::GetPodResourcesRequest>,
    ) -> Result<tonic::Response<v1::GetPodResourcesResponse>, tonic::Status> {
        let r = req.into_inner();
        let pods = self.pods.lock().expect("lock");
        match pods
            .iter()
            .find(|p| p.name == r.pod_name && p.namespace == r.pod_namespace)
        {
            Some(p) => Ok(tonic::Response::new(v1::GetPodResourcesResponse {
                pod_resources: Some(to_proto(p)),
            })),
            None => Err(tonic::Status::not_found(format!(
                "pod {} in namespace {} not found",
                r.pod_name, r.pod_namespace
            ))),
        }
    }
}

/// The server: its socket, and handles on what it answers.
pub struct Kubelet {
    pub socket: PathBuf,
    lister: Lister,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
}

impl Kubelet {
    /// Serves on `dir/kubelet.sock` (the kubelet's socket name) on the
    /// current tokio runtime.
    pub async fn start(dir: &Path) -> Kubelet {
        let socket = dir.join("kubelet.sock");
        let listener = tokio::net::UnixListener::bind(&socket).expect("bind the socket");
        let incoming = tokio_stream::wrappers::UnixListenerStream::new(listener);
        let lister = Lister::default();
        let (tx, rx) = tokio::sync::oneshot::channel::<()>();
        let svc = PodResourcesListerServer::new(lister.clone());
        tokio::spawn(async move {
            let _ = tonic::transport::Server::builder()
                .add_service(svc)
                .serve_with_incoming_shutdown(incoming, async {
                    let _ = rx.await;
                })
                .await;
        });
        Kubelet {
            socket,
            lister,
            stop: Some(tx),
        }
    }

    /// What `List` answers from now on.
    pub fn set_pods(&self, pods: Vec<PodDevices>) {
        *self.lister.pods.lock().expect("lock") = pods;
    }

    /// `List` calls answered so far.
    pub fn list_calls(&self) -> usize {
        *self.lister.calls.lock().expect("lock")
    }

    /// Stops serving and removes the socket.
    pub fn stop(mut self) {
        if let Some(tx) = self.stop.take() {
            let _ = tx.send(());
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}
