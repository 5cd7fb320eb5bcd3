//! The schema source: every function of ours (with the triggers that call a
//! trigger function) has one home file under `schema/<room>/<name>.sql`,
//! embedded at build time. `migrate` applies the files that changed after
//! the numbered migrations, in the same transaction and under the same
//! lock, and records them in `bf4ps_schema_sources` (migration 0022): the
//! repeatable migrations of Flyway, with the file as the unit of review.
//!
//! A file is:
//!
//! ```text
//! -- What the function does (the doc comment; docs/schema.md shows it).
//! --
//! -- owner: bf4ps_definer            (or `migrator`: the role that migrates)
//! -- execute: bf4ps_collector        (or `PUBLIC`, or `owner only`)
//! CREATE OR REPLACE FUNCTION @schema@.bf4ps_name(…) …;
//! CREATE OR REPLACE TRIGGER … EXECUTE FUNCTION @schema@.bf4ps_name();   (trigger functions)
//! ```
//!
//! `@schema@` is the schema `collection_jobs` lives in (normally `public`).
//!
//! Invariants:
//! - one file, one function, one name (no overloads): the owner and the
//!   `EXECUTE` grantees after a run are exactly what the file declares;
//! - files are applied in path order; one that needs an object another
//!   file creates (undefined function, table or object) is tried again
//!   after the others, each attempt in a savepoint;
//! - a file that left the source is forgotten, never dropped: dropping,
//!   like any signature change, is a numbered migration's job;
//! - every set of files applied is remembered (`bf4ps_schema_source_sets`):
//!   a binary whose set was applied once and since replaced is older, and
//!   refuses ([`DbError::SourceSuperseded`]) instead of putting its
//!   functions back.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::LazyLock;

use sha2::{Digest, Sha256};
use sqlx::PgConnection;

use super::DbError;

/// The embedded files: (path under `schema/`, text), sorted by path.
static EMBEDDED: &[(&str, &str)] = include!(concat!(env!("OUT_DIR"), "/schema_sources.rs"));

/// Who owns a function.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Owner {
    /// `bf4ps_definer`: the NOLOGIN owner of the SECURITY DEFINER functions.
    Definer,
    /// The role that runs `migrate` (the schema owner).
    Migrator,
}

/// Who may call a function besides its owner.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Execute {
    /// Everyone (PostgreSQL's default for a function).
    Public,
    /// These group roles, and nobody else.
    Roles(Vec<String>),
}

/// The group roles a file may grant `EXECUTE` to.
const GRANTABLE: &[&str] = &[
    "bf4ps_definer",
    "bf4ps_collector",
    "bf4ps_website",
    "bf4ps_reader",
];

/// One schema source file.
#[derive(Debug, Clone)]
pub struct SourceFile {
    /// Path under `schema/`, e.g. `queue/bf4ps_claim_job.sql`.
    pub path: &'static str,
    /// Its room (the folder), one of ARCHITECTURE.md's.
    pub room: &'static str,
    /// The function it defines.
    pub function: String,
    /// The doc comment, without the `-- ` prefixes.
    pub doc: String,
    /// Who owns the function.
    pub owner: Owner,
    /// Who may call it.
    pub execute: Execute,
    /// The triggers it creates.
    pub triggers: Vec<String>,
    /// The file's text.
    pub text: &'static str,
    /// SHA-256 of the text.
    pub checksum: [u8; 32],
}

/// Why a schema source file cannot be read (a build of a broken tree; the
/// unit tests parse every embedded file).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("schema/{path}: {reason}")]
pub struct SourceFileError {
    /// The file.
    pub path: String,
    /// What is wrong.
    pub reason: String,
}

impl SourceFile {
    /// Reads a file's declarations.
    ///
    /// ```
    /// use bf4ps_ops::db::source::{Execute, Owner, SourceFile};
    ///
    /// let text = "-- Says hello.\n--\n-- owner: migrator\n-- execute: bf4ps_reader\n\
    ///             CREATE OR REPLACE FUNCTION @schema@.bf4ps_hello() RETURNS text\n\
    ///             LANGUAGE sql RETURN 'hello';\n";
    /// let file = SourceFile::parse("demo/bf4ps_hello.sql", text).unwrap();
    /// assert_eq!((file.room, file.function.as_str()), ("demo", "bf4ps_hello"));
    /// assert_eq!(file.doc, "Says hello.");
    /// assert_eq!(file.owner, Owner::Migrator);
    /// assert_eq!(file.execute, Execute::Roles(vec!["bf4ps_reader".into()]));
    ///
    /// // A file is named after its function.
    /// let err = SourceFile::parse("demo/bf4ps_other.sql", text).unwrap_err();
    /// assert!(err.to_string().contains("named after its function"), "{err}");
    /// ```
    pub fn parse(path: &'static str, text: &'static str) -> Result<SourceFile, SourceFileError> {
        let fail = |reason: String| SourceFileError {
            path: path.to_owned(),
            reason,
        };
        let (room, name) = path
            .split_once('/')
            .filter(|(room, name)| {
                !room.is_empty() && name.ends_with(".sql") && !name.contains('/')
            })
            .ok_or_else(|| fail("expected schema/<room>/<name>.sql".into()))?;
        const CREATE: &str = "CREATE OR REPLACE FUNCTION @schema@.";
        let mut creates = text.match_indices(CREATE);
        let start = match (creates.next(), creates.next()) {
            (Some((i, _)), None) => i + CREATE.len(),
            (None, _) => return Err(fail(format!("no `{CREATE}…` statement"))),
            (Some(_), Some(_)) => return Err(fail("defines more than one function".into())),
        };
        let function: String = text[start..]
            .chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect();
        if format!("{function}.sql") != name {
            return Err(fail(format!(
                "defines {function}, but a file is named after its function"
            )));
        }
        if text.contains("CREATE FUNCTION") || text.contains("CREATE TRIGGER") {
            return Err(fail(
                "uses CREATE without OR REPLACE (the file is applied again whenever it changes)"
                    .into(),
            ));
        }
        let header: Vec<&str> = text
            .lines()
            .take_while(|l| l.starts_with("--"))
            .map(|l| l.strip_prefix("-- ").unwrap_or(l.trim_start_matches('-')))
            .collect();
        let mut owner = None;
        let mut execute = None;
        let mut doc = Vec::new();
        for line in &header {
            if let Some(v) = line.strip_prefix("owner:") {
                owner = Some(match v.trim() {
                    "bf4ps_definer" => Owner::Definer,
                    "migrator" => Owner::Migrator,
                    other => {
                        return Err(fail(format!(
                            "owner `{other}`: expected bf4ps_definer or migrator"
                        )));
                    }
                });
            } else if let Some(v) = line.strip_prefix("execute:") {
                execute = Some(match v.trim() {
                    "PUBLIC" => Execute::Public,
                    "owner only" => Execute::Roles(Vec::new()),
                    roles => {
                        let roles: Vec<String> =
                            roles.split(',').map(|r| r.trim().to_owned()).collect();
                        if let Some(bad) = roles.iter().find(|r| !GRANTABLE.contains(&r.as_str())) {
                            return Err(fail(format!(
                                "execute: `{bad}` is not one of {}, PUBLIC or `owner only`",
                                GRANTABLE.join(", ")
                            )));
                        }
                        Execute::Roles(roles)
                    }
                });
            } else if owner.is_none() && execute.is_none() {
                doc.push(*line);
            }
        }
        while doc.last().is_some_and(|l| l.trim().is_empty()) {
            doc.pop();
        }
        if doc.is_empty() {
            return Err(fail("no doc comment before `-- owner:`".into()));
        }
        let owner = owner.ok_or_else(|| fail("no `-- owner:` line".into()))?;
        let execute = execute.ok_or_else(|| fail("no `-- execute:` line".into()))?;
        const TRIGGER: &str = "CREATE OR REPLACE TRIGGER ";
        let triggers = text
            .match_indices(TRIGGER)
            .map(|(i, _)| {
                text[i + TRIGGER.len()..]
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect()
            })
            .collect();
        Ok(SourceFile {
            path,
            room,
            function,
            doc: doc.join("\n"),
            owner,
            execute,
            triggers,
            text,
            checksum: Sha256::digest(text.as_bytes()).into(),
        })
    }
}

/// Every embedded file, parsed; an unreadable one is an error the unit
/// tests catch before any build ships.
pub fn sources() -> Result<&'static [SourceFile], SourceFileError> {
    static PARSED: LazyLock<Result<Vec<SourceFile>, SourceFileError>> = LazyLock::new(|| {
        EMBEDDED
            .iter()
            .map(|(path, text)| SourceFile::parse(path, text))
            .collect()
    });
    PARSED.as_deref().map_err(Clone::clone)
}

fn files() -> Result<&'static [SourceFile], DbError> {
    sources().map_err(|e| DbError::SourceFailed {
        path: e.path.clone(),
        reason: e.reason.clone(),
    })
}

/// Who applied: this binary.
const APPLIED_BY: &str = concat!("bf4ps-ops ", env!("CARGO_PKG_VERSION"));

/// The digest of a set of (path, checksum): what `bf4ps_schema_source_sets`
/// remembers.
fn digest<'a>(set: impl IntoIterator<Item = (&'a str, &'a [u8])>) -> [u8; 32] {
    let mut hasher = Sha256::new();
    for (path, checksum) in set {
        hasher.update(path.as_bytes());
        hasher.update([0]);
        hasher.update(checksum);
    }
    hasher.finalize().into()
}

/// The files as the database last applied them (empty before 0022 ran).
async fn recorded<'e>(
    conn: impl sqlx::PgExecutor<'e>,
) -> Result<BTreeMap<String, Vec<u8>>, sqlx::Error> {
    match sqlx::query_as::<_, (String, Vec<u8>)>(
        "SELECT path, checksum FROM bf4ps_schema_sources ORDER BY path",
    )
    .fetch_all(conn)
    .await
    {
        Ok(rows) => Ok(rows.into_iter().collect()),
        Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42P01") => {
            Ok(BTreeMap::new())
        }
        Err(e) => Err(e),
    }
}

/// Whether the database has exactly this binary's files applied.
pub(super) async fn current<'e>(conn: impl sqlx::PgExecutor<'e>) -> Result<bool, DbError> {
    let recorded = recorded(conn).await.map_err(DbError::Other)?;
    let files = files()?;
    Ok(recorded.len() == files.len()
        && files
            .iter()
            .all(|f| recorded.get(f.path).map(Vec::as_slice) == Some(&f.checksum[..])))
}

/// The files `migrate` would apply now: new or changed since the last run.
pub(super) async fn pending(conn: &mut PgConnection) -> Result<Vec<&'static str>, DbError> {
    let recorded = recorded(&mut *conn).await.map_err(DbError::Other)?;
    Ok(files()?
        .iter()
        .filter(|f| recorded.get(f.path).map(Vec::as_slice) != Some(&f.checksum[..]))
        .map(|f| f.path)
        .collect())
}

/// SQLSTATEs of a file that needs an object a later file creates.
const NOT_YET: &[&str] = &["42883", "42P01", "42704"];

/// Applies the new and changed files inside the caller's transaction (the
/// numbered migrations already ran in it) and records them; returns their
/// paths.
pub(super) async fn apply(conn: &mut PgConnection) -> Result<Vec<&'static str>, DbError> {
    apply_files(conn, files()?).await
}

/// [`apply`] with a set of files of the caller's (`migrate` passes the
/// embedded ones; tests pass others): applies those new or changed since
/// the last run, in the caller's transaction, and records exactly this set.
pub async fn apply_files(
    conn: &mut PgConnection,
    files: &[SourceFile],
) -> Result<Vec<&'static str>, DbError> {
    let recorded = recorded(&mut *conn).await.map_err(DbError::Other)?;
    let ours = digest(files.iter().map(|f| (f.path, &f.checksum[..])));
    let theirs = digest(recorded.iter().map(|(p, c)| (p.as_str(), c.as_slice())));
    if ours == theirs {
        return Ok(Vec::new());
    }
    let superseded: Option<chrono::DateTime<chrono::Utc>> = sqlx::query_scalar(
        "SELECT first_applied_at FROM bf4ps_schema_source_sets WHERE digest = $1",
    )
    .bind(&ours[..])
    .fetch_optional(&mut *conn)
    .await
    .map_err(DbError::Other)?;
    if let Some(at) = superseded {
        return Err(DbError::SourceSuperseded { applied_at: at });
    }
    let schema: String = sqlx::query_scalar(
        "SELECT quote_ident(n.nspname) FROM pg_catalog.pg_class c \
         JOIN pg_catalog.pg_namespace n ON n.oid = c.relnamespace \
         WHERE c.oid = 'collection_jobs'::regclass",
    )
    .fetch_one(&mut *conn)
    .await
    .map_err(DbError::Other)?;
    let mut waiting: Vec<&SourceFile> = files
        .iter()
        .filter(|f| recorded.get(f.path).map(Vec::as_slice) != Some(&f.checksum[..]))
        .collect();
    let applied: Vec<&'static str> = waiting.iter().map(|f| f.path).collect();
    // bf4ps_definer needs CREATE on the schema only while it is handed
    // functions (as migration 0014 did).
    let handing = waiting.iter().any(|f| f.owner == Owner::Definer);
    if handing {
        exec(
            conn,
            &format!("GRANT CREATE ON SCHEMA {schema} TO bf4ps_definer"),
        )
        .await?;
    }
    while !waiting.is_empty() {
        let round = waiting.len();
        let mut later = Vec::new();
        let mut first_error = None;
        for file in std::mem::take(&mut waiting) {
            exec(conn, "SAVEPOINT bf4ps_source").await?;
            match apply_one(conn, &schema, file).await {
                Ok(()) => exec(conn, "RELEASE SAVEPOINT bf4ps_source").await?,
                Err(e) => {
                    exec(conn, "ROLLBACK TO SAVEPOINT bf4ps_source").await?;
                    let not_yet = matches!(&e, sqlx::Error::Database(d)
                        if d.code().is_some_and(|c| NOT_YET.contains(&c.as_ref())));
                    if !not_yet {
                        return Err(source_failed(file, &e));
                    }
                    first_error.get_or_insert((file, e));
                    later.push(file);
                }
            }
        }
        // A round that applied nothing: what the files wait for never comes.
        if later.len() == round
            && let Some((file, e)) = first_error
        {
            return Err(source_failed(file, &e));
        }
        waiting = later;
    }
    if handing {
        exec(
            conn,
            &format!("REVOKE CREATE ON SCHEMA {schema} FROM bf4ps_definer"),
        )
        .await?;
    }
    let paths: Vec<&str> = files.iter().map(|f| f.path).collect();
    let checksums: Vec<&[u8]> = files.iter().map(|f| &f.checksum[..]).collect();
    sqlx::query(
        "WITH f AS (SELECT * FROM unnest($1::text[], $2::bytea[]) AS f(path, checksum)), \
         gone AS (DELETE FROM bf4ps_schema_sources AS s \
                  WHERE NOT EXISTS (SELECT 1 FROM f WHERE f.path = s.path)) \
         INSERT INTO bf4ps_schema_sources AS s (path, checksum, applied_at, applied_by) \
         SELECT f.path, f.checksum, now(), $3 FROM f \
         ON CONFLICT (path) DO UPDATE \
         SET checksum = EXCLUDED.checksum, applied_at = EXCLUDED.applied_at, \
             applied_by = EXCLUDED.applied_by \
         WHERE s.checksum IS DISTINCT FROM EXCLUDED.checksum",
    )
    .bind(&paths)
    .bind(&checksums)
    .bind(APPLIED_BY)
    .execute(&mut *conn)
    .await
    .map_err(DbError::Other)?;
    sqlx::query(
        "INSERT INTO bf4ps_schema_source_sets (digest, applied_by) VALUES ($1, $2) \
         ON CONFLICT (digest) DO NOTHING",
    )
    .bind(&ours[..])
    .bind(APPLIED_BY)
    .execute(&mut *conn)
    .await
    .map_err(DbError::Other)?;
    Ok(applied)
}

/// Runs one file: its statements, then its owner and grantees as declared.
async fn apply_one(
    conn: &mut PgConnection,
    schema: &str,
    file: &SourceFile,
) -> Result<(), sqlx::Error> {
    let text = file.text.replace("@schema@", schema);
    sqlx::raw_sql(sqlx::AssertSqlSafe(text))
        .execute(&mut *conn)
        .await?;
    let (signature, owner, grantees): (String, String, Vec<String>) = sqlx::query_as(
        "SELECT p.oid::regprocedure::text, pg_catalog.pg_get_userbyid(p.proowner)::text, \
                array(SELECT CASE WHEN a.grantee = 0 THEN 'PUBLIC' \
                                  ELSE pg_catalog.pg_get_userbyid(a.grantee)::text END \
                      FROM pg_catalog.aclexplode(coalesce(p.proacl, \
                               pg_catalog.acldefault('f', p.proowner))) AS a \
                      WHERE a.grantee <> p.proowner AND a.privilege_type = 'EXECUTE' \
                      ORDER BY 1) \
         FROM pg_catalog.pg_proc AS p \
         WHERE p.pronamespace = (SELECT c.relnamespace FROM pg_catalog.pg_class AS c \
                                 WHERE c.oid = 'collection_jobs'::regclass) \
           AND p.proname = $1",
    )
    .bind(&file.function)
    .fetch_one(&mut *conn)
    .await?;
    let wanted_owner = match file.owner {
        Owner::Definer => "bf4ps_definer".to_owned(),
        Owner::Migrator => {
            sqlx::query_scalar("SELECT current_user::text")
                .fetch_one(&mut *conn)
                .await?
        }
    };
    if owner != wanted_owner {
        exec_sql(
            conn,
            format!(
                "ALTER FUNCTION {signature} OWNER TO {}",
                quote(&wanted_owner)
            ),
        )
        .await?;
    }
    let wanted: BTreeSet<String> = match &file.execute {
        Execute::Public => BTreeSet::from(["PUBLIC".to_owned()]),
        Execute::Roles(roles) => roles.iter().cloned().collect(),
    };
    let have: BTreeSet<String> = grantees.into_iter().collect();
    if have != wanted {
        for role in have.difference(&wanted) {
            let role = if role == "PUBLIC" {
                role.clone()
            } else {
                quote(role)
            };
            exec_sql(
                conn,
                format!("REVOKE ALL ON FUNCTION {signature} FROM {role}"),
            )
            .await?;
        }
        for role in wanted.difference(&have) {
            let role = if role == "PUBLIC" {
                role.clone()
            } else {
                quote(role)
            };
            exec_sql(
                conn,
                format!("GRANT EXECUTE ON FUNCTION {signature} TO {role}"),
            )
            .await?;
        }
    }
    Ok(())
}

fn quote(ident: &str) -> String {
    format!("\"{}\"", ident.replace('"', "\"\""))
}

async fn exec_sql(conn: &mut PgConnection, sql: String) -> Result<(), sqlx::Error> {
    sqlx::raw_sql(sqlx::AssertSqlSafe(sql))
        .execute(&mut *conn)
        .await
        .map(drop)
}

async fn exec(conn: &mut PgConnection, sql: &str) -> Result<(), DbError> {
    exec_sql(conn, sql.to_owned()).await.map_err(DbError::Other)
}

fn source_failed(file: &SourceFile, e: &sqlx::Error) -> DbError {
    let reason = match e {
        sqlx::Error::Database(d) => d.message().to_owned(),
        other => other.to_string(),
    };
    DbError::SourceFailed {
        path: file.path.to_owned(),
        reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_embedded_file_parses_and_names_its_function() {
        let files = sources().unwrap();
        assert!(files.len() >= 40, "{} files", files.len());
        let mut names = BTreeSet::new();
        for f in files {
            assert!(names.insert(f.function.clone()), "{} twice", f.function);
            assert!(f.path.ends_with(&format!("/{}.sql", f.function)));
        }
    }

    #[test]
    fn a_file_must_declare_its_owner_and_callers() {
        let ok = "-- Does a thing.\n--\n-- owner: migrator\n-- execute: PUBLIC\n\
                  CREATE OR REPLACE FUNCTION @schema@.bf4ps_x() RETURNS int RETURN 1;\n";
        let f = SourceFile::parse("domain/bf4ps_x.sql", ok).unwrap();
        assert_eq!(f.doc, "Does a thing.");
        assert_eq!(f.execute, Execute::Public);
        let cases = [
            (
                "domain/bf4ps_y.sql",
                ok,
                "a file is named after its function",
            ),
            (
                "domain/bf4ps_x.sql",
                "-- owner: migrator\n-- execute: PUBLIC\nCREATE OR REPLACE FUNCTION @schema@.bf4ps_x()",
                "no doc comment",
            ),
            (
                "domain/bf4ps_x.sql",
                "-- Doc.\n-- execute: PUBLIC\nCREATE OR REPLACE FUNCTION @schema@.bf4ps_x()",
                "no `-- owner:` line",
            ),
            (
                "domain/bf4ps_x.sql",
                "-- Doc.\n-- owner: migrator\n-- execute: bf4ps_everyone\n\
                 CREATE OR REPLACE FUNCTION @schema@.bf4ps_x()",
                "`bf4ps_everyone` is not one of",
            ),
            (
                "domain/bf4ps_x.sql",
                "-- Doc.\n-- owner: migrator\n-- execute: PUBLIC\nCREATE FUNCTION @schema@.bf4ps_x()",
                "no `CREATE OR REPLACE FUNCTION",
            ),
        ];
        for (path, text, want) in cases {
            let e = SourceFile::parse(path, text).unwrap_err();
            assert!(e.to_string().contains(want), "{path}: {e}");
        }
    }

    #[test]
    fn the_digest_depends_on_paths_and_checksums() {
        let a = digest([("a/x.sql", &[1u8][..])]);
        assert_eq!(a, digest([("a/x.sql", &[1u8][..])]));
        assert_ne!(a, digest([("a/y.sql", &[1u8][..])]));
        assert_ne!(a, digest([("a/x.sql", &[2u8][..])]));
    }
}
