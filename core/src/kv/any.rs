//! A client of whichever system a store is, behind one type: for callers
//! that pick the system at run time and are not on a measured path (the
//! command line's shell, tests of many systems). Each operation's future is
//! boxed; the harness instead dispatches once per run (`systems::visit`)
//! and keeps every operation statically dispatched.

use alloc::boxed::Box;
use core::future::Future;
use core::ops::Deref;
use core::pin::Pin;

use super::{Got, KvClient, KvError, Limits, Missing, Written};
use crate::swarm::client::Paths;

type Op<'a, T> = Pin<Box<dyn Future<Output = Result<T, KvError>> + 'a>>;

/// [`KvClient`] with boxed futures, so that clients of different systems
/// share one type.
trait DynClient<V> {
    fn name(&self) -> &'static str;
    fn limits(&self) -> Limits;
    fn insert<'a>(&'a mut self, key: &'a [u8], value: &'a [u8]) -> Op<'a, Written>;
    fn update<'a>(&'a mut self, key: &'a [u8], value: &'a [u8]) -> Op<'a, Result<Written, Missing>>;
    fn get<'a>(&'a mut self, key: &'a [u8]) -> Op<'a, Got<V>>;
    fn delete<'a>(&'a mut self, key: &'a [u8]) -> Op<'a, Result<Written, Missing>>;
    fn close(&mut self) -> Op<'_, ()>;
    fn keep(&mut self) -> Op<'_, ()>;
    fn settle_ns(&self) -> u64;
    fn paths(&self) -> Paths;
}

impl<K: KvClient> DynClient<K::Value> for K {
    fn name(&self) -> &'static str {
        KvClient::name(self)
    }

    fn limits(&self) -> Limits {
        KvClient::limits(self)
    }

    fn insert<'a>(&'a mut self, key: &'a [u8], value: &'a [u8]) -> Op<'a, Written> {
        Box::pin(KvClient::insert(self, key, value))
    }

    fn update<'a>(&'a mut self, key: &'a [u8], value: &'a [u8]) -> Op<'a, Result<Written, Missing>> {
        Box::pin(KvClient::update(self, key, value))
    }

    fn get<'a>(&'a mut self, key: &'a [u8]) -> Op<'a, Got<K::Value>> {
        Box::pin(KvClient::get(self, key))
    }

    fn delete<'a>(&'a mut self, key: &'a [u8]) -> Op<'a, Result<Written, Missing>> {
        Box::pin(KvClient::delete(self, key))
    }

    fn close(&mut self) -> Op<'_, ()> {
        Box::pin(KvClient::close(self))
    }

    fn keep(&mut self) -> Op<'_, ()> {
        Box::pin(KvClient::keep(self))
    }

    fn settle_ns(&self) -> u64 {
        KvClient::settle_ns(self)
    }

    fn paths(&self) -> Paths {
        KvClient::paths(self)
    }
}

/// A client of any system whose values are `V` (`systems::connect_any`
/// makes one).
pub struct AnyClient<'a, V> {
    inner: Box<dyn DynClient<V> + 'a>,
}

impl<'a, V: Deref<Target = [u8]>> AnyClient<'a, V> {
    /// `client`, behind the common type.
    pub fn new<K: KvClient<Value = V> + 'a>(client: K) -> Self {
        AnyClient { inner: Box::new(client) }
    }
}

impl<V: Deref<Target = [u8]>> KvClient for AnyClient<'_, V> {
    type Value = V;

    fn name(&self) -> &'static str {
        self.inner.name()
    }

    fn limits(&self) -> Limits {
        self.inner.limits()
    }

    async fn insert(&mut self, key: &[u8], value: &[u8]) -> Result<Written, KvError> {
        self.inner.insert(key, value).await
    }

    async fn update(&mut self, key: &[u8], value: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.inner.update(key, value).await
    }

    async fn get(&mut self, key: &[u8]) -> Result<Got<V>, KvError> {
        self.inner.get(key).await
    }

    async fn delete(&mut self, key: &[u8]) -> Result<Result<Written, Missing>, KvError> {
        self.inner.delete(key).await
    }

    async fn close(&mut self) -> Result<(), KvError> {
        self.inner.close().await
    }

    async fn keep(&mut self) -> Result<(), KvError> {
        self.inner.keep().await
    }

    fn settle_ns(&self) -> u64 {
        self.inner.settle_ns()
    }

    fn paths(&self) -> Paths {
        self.inner.paths()
    }
}
