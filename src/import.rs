//! `bf4ps-ops soldiers import FILE.csv`: bulk-loads soldiers into BF4PS's
//! `soldiers` as BF4PS records a manual submission (the name in
//! `soldier_names`, a `manual` row in `soldier_sources`) and gives every new
//! soldier its default `collection_state` row (never attempted), so the
//! feeder bootstraps it.
//!
//! File format: CSV `platform,persona_id,name`. The first line is a header
//! when its first two fields are `platform` and `persona_id` (any case);
//! otherwise it is data. Fields are trimmed; `platform` is case-insensitive;
//! `name` may be empty or absent (2 fields), which keeps an existing name;
//! otherwise it is 1 to [`MAX_NAME_CHARS`] characters (after trimming) with
//! no control character. BF4PS requires a name: a nameless row of a soldier
//! the database does not know is not imported and counted as
//! `unknown_nameless` (the summary says so; importing it again with a name
//! adds it).
//!
//! Invariants:
//! - input is bounded: no line (in fact no row: a quoted field that spans
//!   lines counts the whole row) is longer than [`MAX_LINE_BYTES`], line
//!   terminator excluded. A longer one stops the import at once with
//!   [`ImportError::LineTooLong`] naming its line, also with
//!   `--skip-invalid` (the rest of the file cannot be split into rows
//!   reliably): nothing is imported. The file is read through
//!   `BoundedRows`, so a row that never ends (`/dev/zero`, a FIFO) fails
//!   after at most [`MAX_LINE_BYTES`] + 1 bytes past the last row's end, and
//!   the reader's memory stays bounded whatever the file;
//! - EVERY row is validated before anything is written. Invalid rows are
//!   reported with their line number and reason; unless `--skip-invalid`,
//!   one invalid row means nothing is imported;
//! - the database side runs in batches of 50,000 rows, each ONE transaction
//!   (`COPY` into a temporary table, then one set-based upsert that also
//!   creates the new soldiers' state rows), two batches at a time. A soldier
//!   and its four state rows are always committed together; a transaction
//!   never grows with the file (locks, WAL bursts and the projector's
//!   transaction horizon stay bounded). If the database fails mid-way, the
//!   committed batches stay and the error says how many rows they hold;
//!   importing the same file again finishes the job (it is idempotent);
//! - a soldier that exists (same platform and persona_id) gets its name
//!   updated (recorded in `soldier_names` like every name BF4PS observes),
//!   never a duplicate row;
//! - a persona listed twice in the file: the LAST row wins, and every
//!   earlier occurrence is reported as a duplicate (it is not an error).

use std::collections::HashMap;
use std::collections::hash_map::Entry;
use std::io::Read;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use sqlx::PgPool;

use crate::domain::Platform;

/// Rows between progress lines on stderr.
const PROGRESS_EVERY: u64 = 250_000;

/// Bytes buffered before each `COPY` chunk is sent.
const COPY_CHUNK: usize = 1 << 20;

/// Rows per transaction: bounds how long an import holds locks and the
/// projector's transaction horizon, and what a failure rolls back.
pub(crate) const DEFAULT_BATCH_ROWS: usize = 50_000;

/// Batches loaded concurrently (each on its own connection).
pub(crate) const DEFAULT_WORKERS: usize = 2;

/// Problems listed in full before "... and N more".
const PROBLEMS_SHOWN: usize = 50;

/// Longest line (row) accepted, in bytes, its line terminator excluded.
pub(crate) const MAX_LINE_BYTES: usize = 4096;

/// Longest soldier name accepted, in characters (after trimming).
pub(crate) const MAX_NAME_CHARS: usize = 200;

/// An import that did not happen.
#[derive(Debug, thiserror::Error)]
pub enum ImportError {
    /// The file could not be read.
    #[error("cannot read {path}: {reason}")]
    Read {
        /// The file.
        path: String,
        /// The I/O or CSV reader's complaint.
        reason: String,
    },
    /// A line (row) is longer than [`MAX_LINE_BYTES`]: nothing was imported,
    /// whatever `--skip-invalid` says.
    #[error(
        "line {line} of {path} is longer than {MAX_LINE_BYTES} bytes{}; nothing imported \
         (expected CSV rows of platform,persona_id,name)",
        continued_onto(*line, *through)
    )]
    LineTooLong {
        /// The file.
        path: String,
        /// 1-based line where the overlong row starts.
        line: u64,
        /// 1-based line where the limit was crossed (after `line` when a
        /// quoted field carries the row over several lines).
        through: u64,
    },
    /// Some rows are invalid and `--skip-invalid` was not given.
    #[error(
        "{} invalid row(s) in {path}; nothing imported (fix them or pass --skip-invalid)",
        invalid.len()
    )]
    Invalid {
        /// The file.
        path: String,
        /// Every invalid row.
        invalid: Vec<InvalidRow>,
    },
    /// The database failed before any batch was committed.
    #[error("import failed, nothing imported: {0}")]
    Db(#[from] sqlx::Error),
    /// The database failed after some batches were committed.
    #[error(
        "import failed after {committed} of {total} rows were committed (importing is \
         idempotent: run the same file again to finish): {source}"
    )]
    Partial {
        /// Rows in committed batches.
        committed: u64,
        /// Valid rows to import.
        total: u64,
        /// The failure.
        source: sqlx::Error,
    },
}

fn continued_onto(line: u64, through: u64) -> String {
    if through > line {
        format!(" (a quoted field carries it on to line {through})")
    } else {
        String::new()
    }
}

/// Why [`parse`] could not read the rows (invalid rows are not errors:
/// they are listed in [`Parsed::invalid`]).
#[derive(Debug, thiserror::Error)]
pub enum ParseError {
    /// A line (row) is longer than [`MAX_LINE_BYTES`].
    #[error(
        "line {line} is longer than {MAX_LINE_BYTES} bytes{}",
        continued_onto(*line, *through)
    )]
    LineTooLong {
        /// 1-based line where the overlong row starts.
        line: u64,
        /// 1-based line where the limit was crossed.
        through: u64,
    },
    /// The I/O or CSV reader's complaint.
    #[error(transparent)]
    Csv(csv::Error),
}

/// How to import.
#[derive(Debug, Clone, Copy)]
pub struct ImportOptions {
    /// Import the valid rows even when some are invalid.
    pub skip_invalid: bool,
    /// Print progress lines to stderr (rows validated, rows loaded).
    pub progress: bool,
    /// Rows per transaction ([`DEFAULT_BATCH_ROWS`]).
    pub batch_rows: usize,
    /// Batches loaded at once, each on its own connection
    /// ([`DEFAULT_WORKERS`]; the pool needs that many connections).
    pub workers: usize,
}

impl Default for ImportOptions {
    fn default() -> Self {
        ImportOptions {
            skip_invalid: false,
            progress: false,
            batch_rows: DEFAULT_BATCH_ROWS,
            workers: DEFAULT_WORKERS,
        }
    }
}

/// A valid data row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SoldierRow {
    /// 1-based line number in the file.
    pub line: u64,
    /// Platform.
    pub platform: Platform,
    /// Battlelog persona id (> 0).
    pub persona_id: i64,
    /// Display name; `None` keeps an existing name.
    pub name: Option<String>,
}

/// A row that failed validation.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct InvalidRow {
    /// 1-based line number in the file.
    pub line: u64,
    /// Why, e.g. `unknown platform "xbox" (expected one of: pc, ps4, xboxone)`.
    pub reason: String,
}

/// An earlier row superseded by a later row for the same persona.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DuplicateRow {
    /// The superseded (earlier) row's line.
    pub line: u64,
    /// The line of the row that wins.
    pub kept_line: u64,
    /// Platform.
    pub platform: Platform,
    /// Persona id.
    pub persona_id: i64,
}

/// A validated file.
#[derive(Debug, Clone, Default)]
pub struct Parsed {
    /// Whether line 1 was a header.
    pub header: bool,
    /// Data rows read (valid, invalid and duplicates).
    pub data_rows: u64,
    /// Valid rows, one per persona (the last occurrence), in file order.
    pub rows: Vec<SoldierRow>,
    /// Invalid rows.
    pub invalid: Vec<InvalidRow>,
    /// Superseded duplicates.
    pub duplicates: Vec<DuplicateRow>,
}

/// What the database did with the valid rows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LoadCounts {
    /// New soldiers (with their `collection_state` row).
    pub inserted: u64,
    /// Existing soldiers whose name changed.
    pub updated: u64,
    /// Existing soldiers left as they were (same name, or no name given).
    pub unchanged: u64,
    /// Nameless rows of soldiers the database does not know: not imported
    /// (BF4PS requires a name).
    pub unknown_nameless: u64,
}

impl std::ops::AddAssign for LoadCounts {
    fn add_assign(&mut self, other: LoadCounts) {
        self.inserted += other.inserted;
        self.updated += other.updated;
        self.unchanged += other.unchanged;
        self.unknown_nameless += other.unknown_nameless;
    }
}

/// The outcome of an import.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ImportReport {
    /// The file.
    pub file: String,
    /// Whether line 1 was a header.
    pub header: bool,
    /// Data rows read.
    pub data_rows: u64,
    /// Database outcome.
    #[serde(flatten)]
    pub counts: LoadCounts,
    /// Invalid rows skipped (only with `--skip-invalid`).
    pub skipped: Vec<InvalidRow>,
    /// Superseded duplicates (the later row won).
    pub duplicates: Vec<DuplicateRow>,
    /// Wall time.
    #[serde(skip)]
    pub elapsed: Duration,
}

impl ImportReport {
    /// One summary line for people.
    pub fn summary(&self) -> String {
        let secs = self.elapsed.as_secs_f64();
        let rate = if secs > 0.0 {
            self.data_rows as f64 / secs
        } else {
            0.0
        };
        format!(
            "imported {}: {} inserted, {} updated, {} unchanged, {} not imported (unknown \
             soldier without a name), {} skipped (invalid), {} duplicate(s) superseded; \
             {} rows in {:.2}s ({:.0} rows/s)",
            self.file,
            self.counts.inserted,
            self.counts.updated,
            self.counts.unchanged,
            self.counts.unknown_nameless,
            self.skipped.len(),
            self.duplicates.len(),
            self.data_rows,
            secs,
            rate
        )
    }

    /// Lines describing skipped rows and superseded duplicates (for stderr).
    pub fn problems(&self) -> Vec<String> {
        let mut out = invalid_lines(&self.skipped, "skipped");
        out.extend(self.duplicates.iter().take(PROBLEMS_SHOWN).map(|d| {
            format!(
                "line {}: duplicate of line {} ({} {}); the later row wins",
                d.line, d.kept_line, d.platform, d.persona_id
            )
        }));
        if self.duplicates.len() > PROBLEMS_SHOWN {
            out.push(format!(
                "... and {} more duplicate(s)",
                self.duplicates.len() - PROBLEMS_SHOWN
            ));
        }
        out
    }
}

/// `line N: verb: reason` for each invalid row (the first 50).
pub(crate) fn invalid_lines(rows: &[InvalidRow], verb: &str) -> Vec<String> {
    let mut out: Vec<String> = rows
        .iter()
        .take(PROBLEMS_SHOWN)
        .map(|r| format!("line {}: {verb}: {}", r.line, r.reason))
        .collect();
    if rows.len() > PROBLEMS_SHOWN {
        out.push(format!(
            "... and {} more invalid row(s)",
            rows.len() - PROBLEMS_SHOWN
        ));
    }
    out
}

/// Reads, validates and imports `path` (see the module doc).
pub async fn import_file(
    pool: &PgPool,
    path: &Path,
    opts: ImportOptions,
) -> Result<ImportReport, ImportError> {
    let started = Instant::now();
    let display = path.display().to_string();
    let read_err = |reason: String| ImportError::Read {
        path: display.clone(),
        reason,
    };
    let file = std::fs::File::open(path).map_err(|e| read_err(e.to_string()))?;
    let parsed = parse(file, opts.progress).map_err(|e| match e {
        ParseError::LineTooLong { line, through } => ImportError::LineTooLong {
            path: display.clone(),
            line,
            through,
        },
        ParseError::Csv(e) => read_err(e.to_string()),
    })?;
    if !parsed.invalid.is_empty() && !opts.skip_invalid {
        return Err(ImportError::Invalid {
            path: display,
            invalid: parsed.invalid,
        });
    }
    let counts = load(pool, Arc::new(parsed.rows), opts).await?;
    Ok(ImportReport {
        file: display,
        header: parsed.header,
        data_rows: parsed.data_rows,
        counts,
        skipped: parsed.invalid,
        duplicates: parsed.duplicates,
        elapsed: started.elapsed(),
    })
}

/// Reads and validates every row (nothing is written). `reader` is read
/// through [`BoundedRows`] (no row over [`MAX_LINE_BYTES`]) and buffered
/// here: pass it unbuffered.
pub fn parse<R: Read>(reader: R, progress: bool) -> Result<Parsed, ParseError> {
    let mut rdr = csv::ReaderBuilder::new()
        .has_headers(false)
        .flexible(true)
        .trim(csv::Trim::All)
        .buffer_capacity(1 << 16)
        .from_reader(BoundedRows::new(reader));
    let out = parse_rows(&mut rdr, progress);
    match (out, rdr.get_ref().too_long) {
        (_, Some(TooLong { line, through })) => Err(ParseError::LineTooLong { line, through }),
        (Err(e), None) => Err(ParseError::Csv(e)),
        (Ok(parsed), None) => Ok(parsed),
    }
}

fn parse_rows<R: Read>(
    rdr: &mut csv::Reader<BoundedRows<R>>,
    progress: bool,
) -> Result<Parsed, csv::Error> {
    let mut out = Parsed::default();
    let mut seen: HashMap<(Platform, i64), usize> = HashMap::new();
    let mut record = csv::ByteRecord::new();
    let mut first = true;
    while rdr.read_byte_record(&mut record)? {
        let line = record.position().map_or(0, |p| p.line());
        if record.iter().all(|f| f.is_empty()) {
            continue; // a blank (whitespace-only) line
        }
        if std::mem::take(&mut first) && is_header(&record) {
            out.header = true;
            continue;
        }
        out.data_rows += 1;
        if progress && out.data_rows.is_multiple_of(PROGRESS_EVERY) {
            eprintln!("validated {} rows…", out.data_rows);
        }
        match validate(&record) {
            Err(reason) => out.invalid.push(InvalidRow { line, reason }),
            Ok((platform, persona_id, name)) => {
                let row = SoldierRow {
                    line,
                    platform,
                    persona_id,
                    name,
                };
                match seen.entry((platform, persona_id)) {
                    Entry::Vacant(v) => {
                        v.insert(out.rows.len());
                        out.rows.push(row);
                    }
                    Entry::Occupied(o) => {
                        let slot = &mut out.rows[*o.get()];
                        out.duplicates.push(DuplicateRow {
                            line: slot.line,
                            kept_line: line,
                            platform,
                            persona_id,
                        });
                        *slot = row;
                    }
                }
            }
        }
    }
    if progress && out.data_rows >= PROGRESS_EVERY {
        eprintln!(
            "validated {} rows ({} invalid, {} duplicate)",
            out.data_rows,
            out.invalid.len(),
            out.duplicates.len()
        );
    }
    Ok(out)
}

/// Where a row crossed [`MAX_LINE_BYTES`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("line {line} is longer than {MAX_LINE_BYTES} bytes")]
struct TooLong {
    line: u64,
    through: u64,
}

/// Where [`BoundedRows`] is in the CSV grammar: the states of the csv
/// reader's own parser (`csv-core` with its defaults: `"` quotes, doubled
/// to escape, no escape character, no comments), so a row ends exactly
/// where the parser ends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Lexer {
    /// At the start of a field (or of a row): a quote opens a quoted field.
    FieldStart,
    /// In an unquoted field: a quote is data.
    Unquoted,
    /// In a quoted field: line terminators are data.
    Quoted,
    /// A quote in a quoted field: another quote is an escaped one; anything
    /// else closes the quoted field.
    QuoteInQuoted,
}

/// A reader that refuses rows longer than [`MAX_LINE_BYTES`] (terminator
/// excluded; a quoted field spanning lines makes one long row) with an I/O
/// error, before handing their bytes on. It never reads further than
/// [`MAX_LINE_BYTES`] + 1 bytes past the end of the last row, so input with
/// no line terminator (`/dev/zero`) fails within one row's worth of reading.
struct BoundedRows<R> {
    inner: R,
    lexer: Lexer,
    /// Bytes of the current row so far (terminators outside quotes excluded).
    row_bytes: usize,
    /// 1-based line of the next byte.
    line: u64,
    /// Line where the current row started.
    row_line: u64,
    too_long: Option<TooLong>,
}

impl<R> BoundedRows<R> {
    fn new(inner: R) -> BoundedRows<R> {
        BoundedRows {
            inner,
            lexer: Lexer::FieldStart,
            row_bytes: 0,
            line: 1,
            row_line: 1,
            too_long: None,
        }
    }

    /// Moves over one byte; `Err` once the row is too long.
    fn step(&mut self, b: u8) -> Result<(), TooLong> {
        let terminator = b == b'\n' || b == b'\r';
        let (next, ends_row) = match (self.lexer, b) {
            (Lexer::Quoted, b'"') => (Lexer::QuoteInQuoted, false),
            (Lexer::Quoted, _) => (Lexer::Quoted, false),
            (Lexer::QuoteInQuoted, b'"') => (Lexer::Quoted, false),
            (Lexer::FieldStart, b'"') => (Lexer::Quoted, false),
            (_, b',') => (Lexer::FieldStart, false),
            (_, _) if terminator => (Lexer::FieldStart, true),
            (_, _) => (Lexer::Unquoted, false),
        };
        self.lexer = next;
        if ends_row {
            self.row_bytes = 0;
        } else {
            if self.row_bytes == 0 {
                self.row_line = self.line;
            }
            self.row_bytes += 1;
            if self.row_bytes > MAX_LINE_BYTES {
                return Err(TooLong {
                    line: self.row_line,
                    through: self.line,
                });
            }
        }
        if b == b'\n' {
            self.line += 1;
        }
        Ok(())
    }
}

impl<R: Read> Read for BoundedRows<R> {
    fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
        if let Some(e) = self.too_long {
            return Err(std::io::Error::other(e));
        }
        // Never more than the rest of a row's allowance (at least 1 byte):
        // an endless row is refused before much more of it is read.
        let allowance = MAX_LINE_BYTES + 1 - self.row_bytes.min(MAX_LINE_BYTES);
        let want = buf.len().min(allowance);
        let n = self.inner.read(&mut buf[..want])?;
        for &b in &buf[..n] {
            if let Err(e) = self.step(b) {
                self.too_long = Some(e);
                return Err(std::io::Error::other(e));
            }
        }
        Ok(n)
    }
}

fn is_header(record: &csv::ByteRecord) -> bool {
    let field = |i: usize| record.get(i).map(|f| f.to_ascii_lowercase());
    field(0).as_deref() == Some(b"platform".as_slice())
        && field(1).as_deref() == Some(b"persona_id".as_slice())
}

/// Checks one data row: `(platform, persona_id, name)` or the reason.
fn validate(record: &csv::ByteRecord) -> Result<(Platform, i64, Option<String>), String> {
    if !(2..=3).contains(&record.len()) {
        return Err(format!(
            "expected 3 fields (platform,persona_id,name), found {}",
            record.len()
        ));
    }
    let text = |i: usize, what: &str| {
        std::str::from_utf8(record.get(i).unwrap_or_default())
            .map_err(|_| format!("{what} is not valid UTF-8"))
    };
    let platform: Platform = text(0, "platform")?
        .to_ascii_lowercase()
        .parse()
        .map_err(|e: crate::domain::UnknownValue| e.to_string())?;
    let persona_text = text(1, "persona_id")?;
    let persona_id = match persona_text.parse::<i64>() {
        Ok(id) if id > 0 => id,
        _ => {
            return Err(format!(
                "persona_id {persona_text:?} is not a positive integer"
            ));
        }
    };
    let name = if record.len() == 3 {
        text(2, "name")?
    } else {
        ""
    };
    let name = name.trim();
    if name.chars().any(char::is_control) {
        return Err("name contains a control character".to_owned());
    }
    let chars = name.chars().count();
    if chars > MAX_NAME_CHARS {
        return Err(format!(
            "name is {chars} characters long (at most {MAX_NAME_CHARS})"
        ));
    }
    let name = (!name.is_empty()).then(|| name.to_owned());
    Ok((platform, persona_id, name))
}

/// New soldiers are written as BF4PS writes a manual submission (name,
/// first and last seen now, the name in `soldier_names`, a `manual`
/// source) with their default state row; existing ones get the new name.
/// Returns (inserted, renamed, unknown without a name).
const UPSERT_SQL: &str = concat!(
    "WITH up AS (",
    " INSERT INTO soldiers AS s (persona_id, platform, current_name, first_seen_at, last_seen_at)",
    " SELECT i.persona_id, i.platform, i.display_name, now(), now() FROM bf4ps_import AS i",
    // Rows that would change nothing skip the (speculative) insert attempt:
    // re-importing an unchanged list costs one index probe per row.
    " WHERE i.display_name IS NOT NULL AND NOT EXISTS (SELECT 1 FROM soldiers AS e",
    "  WHERE e.persona_id = i.persona_id AND e.platform = i.platform",
    "   AND e.current_name = i.display_name)",
    " ORDER BY i.persona_id, i.platform",
    " ON CONFLICT (persona_id, platform) DO UPDATE",
    "  SET current_name = EXCLUDED.current_name,",
    "      last_seen_at = greatest(s.last_seen_at, EXCLUDED.last_seen_at), updated_at = now()",
    "  WHERE s.current_name IS DISTINCT FROM EXCLUDED.current_name",
    " RETURNING s.soldier_id, s.current_name, (s.xmax = 0) AS inserted",
    "), names AS (",
    " INSERT INTO soldier_names AS n (soldier_id, name, first_seen_at, last_seen_at)",
    " SELECT soldier_id, current_name, now(), now() FROM up ORDER BY soldier_id",
    " ON CONFLICT (soldier_id, name) DO UPDATE",
    "  SET last_seen_at = greatest(n.last_seen_at, EXCLUDED.last_seen_at)",
    "), sources AS (",
    " INSERT INTO soldier_sources AS o (soldier_id, source_type, first_seen_at, last_seen_at)",
    " SELECT soldier_id, 'manual', now(), now() FROM up ORDER BY soldier_id",
    " ON CONFLICT (soldier_id, source_type) DO UPDATE",
    "  SET last_seen_at = greatest(o.last_seen_at, EXCLUDED.last_seen_at)",
    "), state AS (",
    " INSERT INTO collection_state (soldier_id)",
    " SELECT soldier_id FROM up WHERE inserted ORDER BY soldier_id",
    " ON CONFLICT (soldier_id) DO NOTHING",
    ")",
    " SELECT (SELECT count(*) FROM up WHERE inserted),",
    "        (SELECT count(*) FROM up WHERE NOT inserted),",
    "        (SELECT count(*) FROM bf4ps_import AS i WHERE i.display_name IS NULL",
    "          AND NOT EXISTS (SELECT 1 FROM soldiers AS e",
    "           WHERE e.persona_id = i.persona_id AND e.platform = i.platform))"
);

/// Writes valid rows in batches of `opts.batch_rows`, each its own
/// transaction (`COPY` into a temporary table, then `UPSERT_SQL`), on
/// `opts.workers` connections at once. Rows are distinct personas (see
/// [`parse`]), so batches never touch the same soldier.
pub async fn load(
    pool: &PgPool,
    rows: Arc<Vec<SoldierRow>>,
    opts: ImportOptions,
) -> Result<LoadCounts, ImportError> {
    let total = rows.len() as u64;
    let batch = opts.batch_rows.max(1);
    let batches = rows.len().div_ceil(batch);
    let next = Arc::new(AtomicUsize::new(0));
    let stop = Arc::new(AtomicBool::new(false));
    let loaded = Arc::new(AtomicU64::new(0));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..opts.workers.clamp(1, batches.max(1)) {
        let (pool, rows, next, stop, loaded) = (
            pool.clone(),
            rows.clone(),
            next.clone(),
            stop.clone(),
            loaded.clone(),
        );
        workers.spawn(async move {
            let mut counts = LoadCounts::default();
            while !stop.load(Ordering::Relaxed) {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= batches {
                    break;
                }
                let chunk = &rows[i * batch..((i + 1) * batch).min(rows.len())];
                match load_batch(&pool, chunk).await {
                    Ok(c) => {
                        counts += c;
                        let before = loaded.fetch_add(chunk.len() as u64, Ordering::Relaxed);
                        let after = before + chunk.len() as u64;
                        if opts.progress && after / PROGRESS_EVERY > before / PROGRESS_EVERY {
                            eprintln!("loaded {after} of {total} rows…");
                        }
                    }
                    Err(e) => {
                        stop.store(true, Ordering::Relaxed);
                        return Err(e);
                    }
                }
            }
            Ok(counts)
        });
    }
    let mut counts = LoadCounts::default();
    let mut failure = None;
    while let Some(joined) = workers.join_next().await {
        match joined {
            Ok(Ok(c)) => counts += c,
            Ok(Err(e)) => failure = failure.or(Some(e)),
            Err(e) => {
                failure = failure.or(Some(sqlx::Error::WorkerCrashed));
                tracing::error!(error = %e, "import worker panicked");
            }
        }
    }
    match failure {
        None => Ok(counts),
        Some(source) => {
            let committed = loaded.load(Ordering::Relaxed);
            if committed == 0 {
                Err(ImportError::Db(source))
            } else {
                Err(ImportError::Partial {
                    committed,
                    total,
                    source,
                })
            }
        }
    }
}

/// One batch in one transaction.
async fn load_batch(pool: &PgPool, rows: &[SoldierRow]) -> Result<LoadCounts, sqlx::Error> {
    let mut tx = pool.begin().await?;
    sqlx::query(
        "CREATE TEMPORARY TABLE bf4ps_import \
         (platform text NOT NULL, persona_id bigint NOT NULL, display_name text) \
         ON COMMIT DROP",
    )
    .execute(&mut *tx)
    .await?;
    let mut copy = tx
        .copy_in_raw(
            "COPY bf4ps_import (platform, persona_id, display_name) FROM STDIN (FORMAT csv)",
        )
        .await?;
    let mut buf: Vec<u8> = Vec::with_capacity(COPY_CHUNK + 4096);
    for row in rows {
        encode_copy_row(&mut buf, row);
        if buf.len() >= COPY_CHUNK {
            copy.send(std::mem::take(&mut buf)).await?;
            buf.reserve(COPY_CHUNK + 4096);
        }
    }
    if !buf.is_empty() {
        copy.send(buf).await?;
    }
    copy.finish().await?;
    let (inserted, updated, nameless): (i64, i64, i64) =
        sqlx::query_as(UPSERT_SQL).fetch_one(&mut *tx).await?;
    tx.commit().await?;
    let count = |n: i64| n.max(0) as u64;
    let (inserted, updated, nameless) = (count(inserted), count(updated), count(nameless));
    Ok(LoadCounts {
        inserted,
        updated,
        unchanged: (rows.len() as u64).saturating_sub(inserted + updated + nameless),
        unknown_nameless: nameless,
    })
}

/// Appends one `COPY ... (FORMAT csv)` line: the name is always quoted
/// (quotes doubled); a missing name is an unquoted empty field, i.e. NULL.
fn encode_copy_row(buf: &mut Vec<u8>, row: &SoldierRow) {
    buf.extend_from_slice(row.platform.as_str().as_bytes());
    buf.push(b',');
    buf.extend_from_slice(row.persona_id.to_string().as_bytes());
    buf.push(b',');
    if let Some(name) = &row.name {
        buf.push(b'"');
        for b in name.bytes() {
            if b == b'"' {
                buf.push(b'"');
            }
            buf.push(b);
        }
        buf.push(b'"');
    }
    buf.push(b'\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse_str(s: &str) -> Parsed {
        parse(s.as_bytes(), false).unwrap()
    }

    #[test]
    fn header_is_detected_only_when_present() {
        let with = parse_str("Platform,Persona_ID,name\npc,1,A\n");
        assert!(with.header);
        assert_eq!(with.rows.len(), 1);
        assert_eq!(with.rows[0].line, 2);
        let without = parse_str("pc,1,A\nps4,2,B\n");
        assert!(!without.header);
        assert_eq!(without.rows.len(), 2);
        assert_eq!(without.rows[0].line, 1);
    }

    #[test]
    fn every_bad_row_is_reported_with_its_line() {
        let p = parse_str(
            "platform,persona_id,name\n\
             pc,1,Good\n\
             xbox,2,Bad platform\n\
             pc,-3,Bad id\n\
             pc,abc,Bad id\n\
             pc\n\
             pc,4,Too,many\n\
             PS4, 5 , Spaced \n\
             pc,6\n",
        );
        let lines: Vec<u64> = p.invalid.iter().map(|r| r.line).collect();
        assert_eq!(lines, vec![3, 4, 5, 6, 7]);
        assert_eq!(
            p.invalid[0].reason,
            "unknown platform \"xbox\" (expected one of: pc, ps4, xboxone)"
        );
        assert!(
            p.invalid[1]
                .reason
                .contains("\"-3\" is not a positive integer")
        );
        assert!(p.invalid[3].reason.contains("found 1"));
        assert!(p.invalid[4].reason.contains("found 4"));
        assert_eq!(p.data_rows, 8);
        assert_eq!(
            p.rows[1],
            SoldierRow {
                line: 8,
                platform: Platform::Ps4,
                persona_id: 5,
                name: Some("Spaced".into())
            }
        );
        assert_eq!(p.rows[2].name, None);
    }

    #[test]
    fn duplicates_last_wins_and_are_reported() {
        let p = parse_str("pc,1,First\npc,2,Other\npc,1,Second\npc,1,Third\n");
        assert_eq!(p.rows.len(), 2);
        assert_eq!(p.rows[0].name.as_deref(), Some("Third"));
        assert_eq!(p.rows[0].line, 4);
        let dups: Vec<(u64, u64)> = p.duplicates.iter().map(|d| (d.line, d.kept_line)).collect();
        assert_eq!(dups, vec![(1, 3), (3, 4)]);
    }

    #[test]
    fn copy_lines_quote_names_and_null_missing_ones() {
        let mut buf = Vec::new();
        let mut row = SoldierRow {
            line: 1,
            platform: Platform::XboxOne,
            persona_id: 42,
            name: Some("a \"b\", c".into()),
        };
        encode_copy_row(&mut buf, &row);
        row.name = None;
        encode_copy_row(&mut buf, &row);
        assert_eq!(
            String::from_utf8(buf).unwrap(),
            "xboxone,42,\"a \"\"b\"\", c\"\nxboxone,42,\n"
        );
    }

    #[test]
    fn quoted_names_and_blank_lines() {
        let p = parse_str("pc,1,\"Smith, John \"\"JJ\"\"\"\n\n   \npc,2,\"bad\u{7}\"\n");
        assert_eq!(p.rows[0].name.as_deref(), Some("Smith, John \"JJ\""));
        assert_eq!(p.invalid.len(), 1);
        assert_eq!(p.invalid[0].line, 4);
        assert_eq!(p.data_rows, 2);
    }

    fn too_long(s: &[u8]) -> (u64, u64) {
        match parse(s, false) {
            Err(ParseError::LineTooLong { line, through }) => (line, through),
            other => panic!("expected LineTooLong, got {other:?}"),
        }
    }

    #[test]
    fn lines_are_at_most_4_kib_without_their_terminator() {
        let name = |n: usize| "x".repeat(n);
        let prefix = "pc,1,".len();
        // Exactly at the limit, with either terminator (or none at the end).
        for end in ["\n", "\r\n", ""] {
            let text = format!("pc,2,ok\npc,1,{}{end}", name(MAX_LINE_BYTES - prefix));
            let p = parse(text.as_bytes(), false).unwrap();
            assert_eq!(p.data_rows, 2, "{end:?}");
            assert_eq!(p.invalid.len(), 1, "a 4 KiB name is too long a name");
            assert_eq!(p.invalid[0].line, 2);
        }
        let text = format!(
            "pc,2,ok\r\n\npc,1,{}\npc,3,x\n",
            name(MAX_LINE_BYTES - prefix + 1)
        );
        assert_eq!(too_long(text.as_bytes()), (3, 3));
        // A quoted field carrying a row over lines counts the whole row.
        let text = format!("pc,1,\"a\n{}\n{}\"\n", name(3000), name(3000));
        assert_eq!(too_long(text.as_bytes()), (1, 3));
        // A quote inside an unquoted field is data: later lines are rows.
        let text = format!("pc,1,a\"b\n{}", format!("pc,2,{}\n", name(100)).repeat(100));
        let p = parse(text.as_bytes(), false).unwrap();
        assert_eq!((p.data_rows, p.invalid.len()), (101, 0));
        // Doubled quotes and a closing quote followed by data, as csv reads them.
        let p = parse_str("pc,1,\"a \"\"b\"\" c\"\npc,2,\"d\"e\n");
        assert_eq!(p.rows[0].name.as_deref(), Some("a \"b\" c"));
        assert_eq!(p.rows[1].name.as_deref(), Some("de"));
    }

    /// Counts the bytes read through it.
    struct Counting<R>(R, std::rc::Rc<std::cell::Cell<u64>>);

    impl<R: Read> Read for Counting<R> {
        fn read(&mut self, buf: &mut [u8]) -> std::io::Result<usize> {
            let n = self.0.read(buf)?;
            self.1.set(self.1.get() + n as u64);
            Ok(n)
        }
    }

    #[test]
    fn an_endless_line_fails_within_one_line_of_reading() {
        let head = b"platform,persona_id,name\npc,1,a\n";
        let read = std::rc::Rc::new(std::cell::Cell::new(0));
        let endless = Counting(head.chain(std::io::repeat(0)), read.clone());
        let e = parse(endless, false).unwrap_err();
        assert_eq!(e.to_string(), "line 3 is longer than 4096 bytes");
        assert_eq!(read.get(), (head.len() + MAX_LINE_BYTES + 1) as u64);
    }

    #[test]
    fn names_are_bounded_and_printable() {
        let ok = "é".repeat(MAX_NAME_CHARS);
        let long = "é".repeat(MAX_NAME_CHARS + 1);
        let p = parse_str(&format!(
            "pc,1, {ok} \npc,2,{long}\npc,3,a\u{1b}[2Jb\npc,4,\"a\rb\"\npc,5,\npc,6, \u{3000} \n"
        ));
        let invalid: Vec<(u64, &str)> = p
            .invalid
            .iter()
            .map(|r| (r.line, r.reason.as_str()))
            .collect();
        assert_eq!(
            invalid,
            vec![
                (2, "name is 201 characters long (at most 200)"),
                (3, "name contains a control character"),
                (4, "name contains a control character"),
            ]
        );
        assert_eq!(p.rows[0].name.as_deref(), Some(ok.as_str()));
        // Empty (also after trimming Unicode spaces) keeps the existing name.
        assert_eq!(
            (p.rows[1].name.as_deref(), p.rows[2].name.as_deref()),
            (None, None)
        );
    }
}
