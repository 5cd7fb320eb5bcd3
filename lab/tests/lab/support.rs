//! Test scaffolding of the lab: the built `bf4ps-lab`, a fresh database
//! per test (`#[sqlx::test]` under the master database of DATABASE_URL),
//! deadline-bounded waiting and child processes that never outlive a test.

#![allow(dead_code)]

use std::future::Future;
use std::time::Duration;

use sqlx::PgPool;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

/// The built lab binary.
pub fn bin() -> std::process::Command {
    std::process::Command::new(env!("CARGO_BIN_EXE_bf4ps-lab"))
}

/// The master URL the test run was given.
pub fn master_url() -> String {
    std::env::var("DATABASE_URL").expect("DATABASE_URL must be set (run scripts/test)")
}

/// `url` with its database name replaced.
pub fn url_with_database(url: &str, database: &str) -> String {
    let (head, query) = match url.split_once('?') {
        Some((h, q)) => (h, Some(q)),
        None => (url, None),
    };
    let scheme_end = head.find("://").map(|i| i + 3).unwrap_or(0);
    let base = match head[scheme_end..].find('/') {
        Some(i) => &head[..scheme_end + i],
        None => head,
    };
    match query {
        Some(q) => format!("{base}/{database}?{q}"),
        None => format!("{base}/{database}"),
    }
}

/// A test's own database, created empty by `#[sqlx::test(migrations = false)]`.
pub struct TestDb {
    /// A pool on it.
    pub pool: PgPool,
    /// Its URL (for child processes).
    pub url: String,
}

impl TestDb {
    /// Wraps the database `#[sqlx::test]` created for this test.
    pub async fn new(opts: PgConnectOptions) -> TestDb {
        let name = opts.get_database().expect("test database name").to_owned();
        let url = url_with_database(&master_url(), &name);
        let pool = PgPoolOptions::new()
            .max_connections(4)
            .connect_with(opts)
            .await
            .expect("connect to the test database");
        TestDb { pool, url }
    }
}

/// Polls `check` until it returns `Some`, failing the test after `deadline`.
pub async fn eventually<T, F, Fut>(deadline: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let start = tokio::time::Instant::now();
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if start.elapsed() > deadline {
            panic!("timed out after {deadline:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A child process that is killed (SIGKILL) and reaped when dropped.
pub struct ChildGuard(pub std::process::Child);

impl std::ops::Deref for ChildGuard {
    type Target = std::process::Child;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl std::ops::DerefMut for ChildGuard {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
        }
        let _ = self.0.wait();
    }
}
