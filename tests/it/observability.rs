//! Checks of the observability artefacts: `alerts/bf4ps.rules.yml`
//! (promtool lint and unit tests, alert conventions, runbook sections),
//! `dashboards/*.json` (Grafana conventions per panel) and every PromQL
//! expression in both (parsed, and each metric name proven exported).
//!
//! The name check is split so the end-to-end test (`prometheus_e2e`) can
//! reuse it: [`metric_names_used`] parses one expression (Grafana variables
//! substituted) and [`unexported_names`] checks every expression of the
//! repository against a set of exported names. That set comes from real
//! expositions: the `/metrics` body of a running `serve`
//! ([`serve_exposition`]) and what a collector renders
//! ([`collector_exposition`]), read with [`exposition_exported`]; the
//! catalog is checked against both ([`catalog_disagreements`]).

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use bf4ps_ops::collector::CollectorMetrics;
use bf4ps_ops::domain::{Lane, PriorityClass, Resource};
use bf4ps_ops::metrics::Registry;
use bf4ps_ops::metrics::catalog::{CATALOG, Exporter, Kind};
use bf4ps_ops::serve::{Serve, ServeSettings};
use bf4ps_ops::tuning::ServeTuning;
use promql_parser::label::MatchOp;
use promql_parser::parser::{self, Expr, VectorSelector};
use serde::Deserialize;
use serde_json::Value;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};

use crate::fixtures;
use crate::projector::{Ev, insert};
use crate::support::{TestDb, eventually, exec, http_text};

/// The rules file, relative to the repository root.
pub const RULES_FILE: &str = "alerts/bf4ps.rules.yml";
/// Where every alert's `runbook_url` points (plus `#<alert name lowercased>`).
pub const RUNBOOK_URL: &str = "https://github.com/bf4ps/bf4ps-ops/blob/main/docs/runbook.md";
/// What `$__rate_interval` becomes before parsing: an unusual duration, so a
/// range selector that reads exactly this was written as `$__rate_interval`.
const RATE_INTERVAL_SENTINEL: Duration = Duration::from_secs(12_345);
/// Functions whose argument is a counter's range (the only place counters may be).
const COUNTER_FUNCTIONS: &[&str] = &["rate", "increase", "irate"];
/// Scrape target health, written by Prometheus itself.
const PROMETHEUS_BUILTINS: &[&str] = &["up"];

// ---------------------------------------------------------------- files

/// The repository root.
pub fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()))
}

/// Files of `dir` (relative to the repository) ending in `suffix`, sorted.
fn files(dir: &str, suffix: &str) -> Vec<PathBuf> {
    let dir = repo().join(dir);
    let mut out: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("read {}: {e}", dir.display()))
        .map(|e| e.expect("directory entry").path())
        .filter(|p| p.to_string_lossy().ends_with(suffix))
        .collect();
    out.sort();
    assert!(!out.is_empty(), "no *{suffix} in {}", dir.display());
    out
}

fn file_name(path: &Path) -> String {
    path.file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default()
}

/// A Prometheus rules file.
#[derive(Debug, Deserialize)]
pub struct RuleFile {
    /// Rule groups.
    pub groups: Vec<RuleGroup>,
}

/// One rule group.
#[derive(Debug, Deserialize)]
pub struct RuleGroup {
    /// Group name.
    pub name: String,
    /// Rules, evaluated in order.
    pub rules: Vec<Rule>,
}

/// A recording or alerting rule.
#[derive(Debug, Deserialize)]
pub struct Rule {
    /// Recorded series name (recording rules).
    pub record: Option<String>,
    /// Alert name (alerting rules).
    pub alert: Option<String>,
    /// PromQL.
    pub expr: String,
    /// `for:` of an alert.
    #[serde(rename = "for")]
    pub for_: Option<String>,
    /// Extra labels.
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Annotations of an alert.
    #[serde(default)]
    pub annotations: BTreeMap<String, String>,
}

impl Rule {
    fn name(&self) -> &str {
        self.alert
            .as_deref()
            .or(self.record.as_deref())
            .unwrap_or("<unnamed>")
    }
}

/// The parsed rules file.
pub fn rules() -> RuleFile {
    let text = read(&repo().join(RULES_FILE));
    serde_yaml_ng::from_str(&text).unwrap_or_else(|e| panic!("{RULES_FILE}: {e}"))
}

/// Names the rules file records.
pub fn recording_rule_names() -> BTreeSet<String> {
    rules()
        .groups
        .iter()
        .flat_map(|g| &g.rules)
        .filter_map(|r| r.record.clone())
        .collect()
}

/// Every dashboard: file name and JSON.
pub fn dashboards() -> Vec<(String, Value)> {
    files("dashboards", ".json")
        .iter()
        .map(|p| {
            let json = serde_json::from_str(&read(p))
                .unwrap_or_else(|e| panic!("{}: invalid JSON: {e}", p.display()));
            (file_name(p), json)
        })
        .collect()
}

/// The panels of a dashboard, rows' collapsed panels included.
fn panels(dashboard: &Value) -> Vec<&Value> {
    fn walk<'a>(list: &'a Value, out: &mut Vec<&'a Value>) {
        for p in list.as_array().into_iter().flatten() {
            out.push(p);
            if let Some(inner) = p.get("panels") {
                walk(inner, out);
            }
        }
    }
    let mut out = Vec::new();
    if let Some(list) = dashboard.get("panels") {
        walk(list, &mut out);
    }
    out
}

fn panel_title(panel: &Value) -> &str {
    panel
        .get("title")
        .and_then(Value::as_str)
        .unwrap_or("<untitled>")
}

/// One query a dashboard runs: a panel target or a variable's series selector.
#[derive(Debug, Clone)]
pub struct DashboardQuery {
    /// Dashboard file name, e.g. `fleet.json`.
    pub file: String,
    /// Panel title (`None` for a variable's query).
    pub panel: Option<String>,
    /// Target refId, or the variable's name.
    pub ref_id: String,
    /// PromQL, Grafana variables not substituted.
    pub expr: String,
}

impl DashboardQuery {
    /// Where it is, e.g. `dashboards/fleet.json / panel "Busy collectors" / A`.
    pub fn place(&self) -> String {
        match &self.panel {
            Some(title) => format!(
                "dashboards/{} / panel {title:?} / {}",
                self.file, self.ref_id
            ),
            None => format!("dashboards/{} / variable {:?}", self.file, self.ref_id),
        }
    }
}

/// Every query of every dashboard: panel targets, then the selectors of the
/// `label_values(...)` variables.
pub fn dashboard_queries() -> Vec<DashboardQuery> {
    let mut out = Vec::new();
    for (file, dash) in dashboards() {
        for panel in panels(&dash) {
            for target in panel
                .get("targets")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                if let Some(expr) = target.get("expr").and_then(Value::as_str) {
                    out.push(DashboardQuery {
                        file: file.clone(),
                        panel: Some(panel_title(panel).to_owned()),
                        ref_id: target
                            .get("refId")
                            .and_then(Value::as_str)
                            .unwrap_or("?")
                            .to_owned(),
                        expr: expr.to_owned(),
                    });
                }
            }
        }
        for var in dash["templating"]["list"].as_array().into_iter().flatten() {
            if let Some(q) = var.get("definition").and_then(Value::as_str)
                && let Some(selector) = label_values_selector(q)
            {
                out.push(DashboardQuery {
                    file: file.clone(),
                    panel: None,
                    ref_id: var["name"].as_str().unwrap_or("?").to_owned(),
                    expr: selector.to_owned(),
                });
            }
        }
    }
    out
}

/// Every PromQL expression of the repository: where it is, and its text.
pub fn all_expressions() -> Vec<(String, String)> {
    let mut out = Vec::new();
    for group in rules().groups {
        for rule in &group.rules {
            out.push((
                format!("{RULES_FILE} / {} / {}", group.name, rule.name()),
                rule.expr.clone(),
            ));
        }
    }
    out.extend(dashboard_queries().into_iter().map(|q| (q.place(), q.expr)));
    out
}

/// The series selector of a Grafana `label_values(selector, label)` query.
fn label_values_selector(query: &str) -> Option<&str> {
    let inner = query
        .trim()
        .strip_prefix("label_values(")?
        .strip_suffix(')')?;
    let (selector, _label) = inner.rsplit_once(',')?;
    Some(selector.trim())
}

// ---------------------------------------------------------------- PromQL

/// Replaces Grafana variables so the text parses as PromQL:
/// `$__rate_interval` by a sentinel duration, `$__interval`/`$__range` by
/// durations, any other `$name`, `${name}`, `${name:fmt}` or `[[name]]` by
/// `grafana_<name>` (they only occur inside label matcher strings).
pub fn substitute_grafana_variables(expr: &str) -> String {
    substitute_variables(expr, |name| match name {
        "__rate_interval" => format!("{}s", RATE_INTERVAL_SENTINEL.as_secs()),
        "__interval" => "60s".to_owned(),
        "__range" => "3600s".to_owned(),
        "__interval_ms" | "__range_ms" => "60000".to_owned(),
        "__range_s" => "3600".to_owned(),
        other => format!("grafana_{other}"),
    })
}

/// Replaces every Grafana variable (`$name`, `${name}`, `${name:fmt}`,
/// `[[name]]`) by `replacement(name)`.
pub fn substitute_variables(expr: &str, replacement: impl Fn(&str) -> String) -> String {
    let mut out = String::with_capacity(expr.len());
    let mut rest = expr;
    while let Some(i) = rest.find(['$', '[']) {
        out.push_str(&rest[..i]);
        let tail = &rest[i..];
        if let Some(braced) = tail.strip_prefix("${") {
            let end = braced.find('}').unwrap_or(braced.len());
            let name = braced[..end].split(':').next().unwrap_or("");
            out.push_str(&replacement(name));
            rest = braced.get(end + 1..).unwrap_or("");
        } else if let Some(bracketed) = tail.strip_prefix("[[") {
            let end = bracketed.find("]]").unwrap_or(bracketed.len());
            out.push_str(&replacement(&bracketed[..end]));
            rest = bracketed.get(end + 2..).unwrap_or("");
        } else if let Some(plain) = tail.strip_prefix('$') {
            let end = plain
                .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .unwrap_or(plain.len());
            if end == 0 {
                out.push('$');
            } else {
                out.push_str(&replacement(&plain[..end]));
            }
            rest = &plain[end..];
        } else {
            out.push_str(&tail[..1]);
            rest = &tail[1..];
        }
    }
    out.push_str(rest);
    out
}

/// Parses an expression after substituting Grafana variables.
pub fn parse_promql(expr: &str) -> Result<Expr, String> {
    parser::parse(&substitute_grafana_variables(expr))
}

/// One series selector of an expression, with where it sits.
#[derive(Debug, Clone)]
pub struct Selector {
    /// Metric name (`None` when only a `__name__` regex selects it).
    pub name: Option<String>,
    /// Label matchers other than the name: (label, operator, value).
    pub matchers: Vec<(String, String, String)>,
    /// Range of a range selector (`x[5m]`).
    pub range: Option<Duration>,
    /// Function this selector is a direct argument of.
    pub function: Option<&'static str>,
}

fn selector(
    vs: &VectorSelector,
    range: Option<Duration>,
    function: Option<&'static str>,
) -> Selector {
    let mut name = vs.name.clone();
    let mut matchers = Vec::new();
    for m in &vs.matchers.matchers {
        let op = match &m.op {
            MatchOp::Equal => "=",
            MatchOp::NotEqual => "!=",
            MatchOp::Re(_) => "=~",
            MatchOp::NotRe(_) => "!~",
        };
        if m.name == "__name__" {
            if op == "=" && name.is_none() {
                name = Some(m.value.clone());
            }
        } else {
            matchers.push((m.name.clone(), op.to_owned(), m.value.clone()));
        }
    }
    Selector {
        name,
        matchers,
        range,
        function,
    }
}

/// Every series selector of a parsed expression.
pub fn selectors(expr: &Expr) -> Vec<Selector> {
    fn walk(expr: &Expr, function: Option<&'static str>, out: &mut Vec<Selector>) {
        match expr {
            Expr::Aggregate(a) => {
                walk(&a.expr, None, out);
                if let Some(p) = &a.param {
                    walk(p, None, out);
                }
            }
            Expr::Unary(u) => walk(&u.expr, None, out),
            Expr::Binary(b) => {
                walk(&b.lhs, None, out);
                walk(&b.rhs, None, out);
            }
            Expr::Paren(p) => walk(&p.expr, None, out),
            Expr::Subquery(s) => walk(&s.expr, None, out),
            Expr::VectorSelector(vs) => out.push(selector(vs, None, function)),
            Expr::MatrixSelector(ms) => out.push(selector(&ms.vs, Some(ms.range), function)),
            Expr::Call(c) => {
                for arg in &c.args.args {
                    walk(arg, Some(c.func.name), out);
                }
            }
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => {}
        }
    }
    let mut out = Vec::new();
    walk(expr, None, &mut out);
    out
}

/// The metric names an expression (Grafana variables allowed) reads.
/// Errors on unparsable text or a selector without a literal metric name.
pub fn metric_names_used(expr: &str) -> Result<BTreeSet<String>, String> {
    let parsed = parse_promql(expr)?;
    selectors(&parsed)
        .into_iter()
        .map(|s| {
            s.name
                .ok_or_else(|| "a selector does not name its metric literally".to_owned())
        })
        .collect()
}

// ------------------------------------------------------- exported names

/// Series that may only be read through `rate`/`increase`/`irate`: the
/// catalog's counters and histogram components.
pub fn counter_series() -> BTreeSet<String> {
    CATALOG
        .iter()
        .flat_map(|m| match m.kind {
            Kind::Histogram => ["_bucket", "_sum", "_count"]
                .iter()
                .map(|s| format!("{}{s}", m.name))
                .collect::<Vec<_>>(),
            Kind::Counter => vec![m.name.to_owned()],
            Kind::Gauge => vec![],
        })
        .collect()
}

/// Series names in a Prometheus text exposition (`# TYPE` families and
/// sample names), e.g. the body of `serve`'s `/metrics`.
pub fn exposition_exported(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for line in text.lines().map(str::trim).filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let mut words = rest.split_whitespace();
            if let (Some(name), Some(kind)) = (words.next(), words.next()) {
                if kind == "histogram" {
                    for s in ["_bucket", "_sum", "_count"] {
                        out.insert(format!("{name}{s}"));
                    }
                } else {
                    out.insert(name.to_owned());
                }
            }
        } else if !line.starts_with('#') {
            let end = line.find(['{', ' ']).unwrap_or(line.len());
            out.insert(line[..end].to_owned());
        }
    }
    out
}

/// Families in an exposition, from its `# TYPE` lines: name → type.
pub fn exposition_families(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.trim().strip_prefix("# TYPE "))
        .filter_map(|rest| {
            let mut words = rest.split_whitespace();
            Some((words.next()?.to_owned(), words.next()?.to_owned()))
        })
        .collect()
}

/// Catalog families `exporter` should export that have no sample line in
/// `text` (a histogram counts when any of its series has one).
pub fn families_without_samples(text: &str, exporter: Exporter) -> Vec<&'static str> {
    let samples: BTreeSet<&str> = text
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| &l[..l.find(['{', ' ']).unwrap_or(l.len())])
        .collect();
    CATALOG
        .iter()
        .filter(|m| m.exported_by(exporter))
        .filter(|m| {
            !samples.iter().any(|s| {
                s.strip_prefix(m.name)
                    .is_some_and(|rest| ["", "_bucket", "_sum", "_count"].contains(&rest))
            })
        })
        .map(|m| m.name)
        .collect()
}

/// Disagreements between the catalog and what the processes render: a
/// family missing from its exporter's exposition, rendered with another
/// type, or rendered but not in the catalog.
pub fn catalog_disagreements(serve: &str, collector: &str) -> Vec<String> {
    let kind = |k: Kind| match k {
        Kind::Counter => "counter",
        Kind::Gauge => "gauge",
        Kind::Histogram => "histogram",
    };
    let mut problems = Vec::new();
    for (process, exporter, text) in [
        ("serve", Exporter::Serve, serve),
        ("collector", Exporter::Collector, collector),
    ] {
        let families = exposition_families(text);
        for m in CATALOG {
            let expected = m.exported_by(exporter);
            match (expected, families.get(m.name)) {
                (true, None) => problems.push(format!(
                    "{}: in the catalog for {process}, missing from its /metrics",
                    m.name
                )),
                (true, Some(t)) if t != kind(m.kind) => problems.push(format!(
                    "{}: {process} renders it as {t}, the catalog says {}",
                    m.name,
                    kind(m.kind)
                )),
                (false, Some(_)) => problems.push(format!(
                    "{}: {process} renders it, the catalog says {:?} exports it",
                    m.name, m.exporter
                )),
                _ => {}
            }
        }
        for name in families.keys() {
            if bf4ps_ops::metrics::catalog::find(name).is_none() {
                problems.push(format!("{name}: {process} renders it, not in the catalog"));
            }
        }
    }
    problems
}

/// What a `collector --metrics-listen` process renders, built the way the
/// CLI builds it: job counters and egress wait for its lane and egress key,
/// its listener's reconnect counter, build info.
pub fn collector_exposition() -> String {
    let registry = Registry::new();
    registry.set_build_info();
    let _ = registry.counter(
        "bf4ps_listener_reconnects_total",
        &[("process", "collector")],
    );
    let _ = CollectorMetrics::register(&registry, Lane::Background, "egress-test");
    registry.render()
}

/// Starts a real `serve` ([`Serve::standard`]) on `db`, with rows behind
/// every table-backed gauge and a few events, and returns its `/metrics`
/// body (over HTTP) once every family the catalog gives `serve` has at
/// least one series.
pub async fn serve_exposition(db: &TestDb) -> String {
    let p = &db.pool;
    fixtures::collector(p, "obs-a", Lane::Background).await;
    let s = fixtures::soldier(p, 77).await;
    exec(
        p,
        format!(
            "UPDATE collection_state \
             SET profile_state = 'success', profile_next_due_at = now() + interval '1 day', \
                 profile_last_success_at = now() - interval '2 days', \
                 detailed_next_due_at = now() + interval '1 day' \
             WHERE soldier_id = {s}"
        ),
    )
    .await
    .expect("seed collection_state");
    fixtures::job(
        p,
        s,
        Resource::Weapons,
        Lane::Background,
        PriorityClass::Recent,
        0,
        -1000,
    )
    .await;
    for ev in [
        Ev {
            previous_success_ago_s: Some(3_600.0),
            ..Ev::succeeded(120)
        },
        Ev {
            http_status: Some(503),
            error_class: Some("server"),
            result: Some("failed"),
            duration_ms: Some(40),
            ..Ev::new("failed")
        },
    ] {
        insert(p, &ev).await;
    }
    let tuning = {
        let mut t = ServeTuning::default();
        t.gauges.gauge_interval = Duration::from_millis(100);
        t.poll.poll_interval = Duration::from_millis(100);
        t.monitor.monitor_interval = Duration::from_millis(100);
        t
    };
    let running = Serve::standard(
        db.target.clone(),
        tuning,
        ServeSettings::new("127.0.0.1:0".parse().expect("address")),
    )
    .start()
    .await
    .expect("serve starts");
    let url = format!("http://{}/metrics", running.addr());
    let cancel = running.cancel_token();
    let serving = tokio::spawn(running.run_until(cancel.clone().cancelled_owned()));
    let body = eventually(
        Duration::from_secs(20),
        "serve to export every serve family (gauges refreshed, events projected)",
        || async {
            let body = http_text(&url).await?;
            families_without_samples(&body, Exporter::Serve)
                .is_empty()
                .then_some(body)
        },
    )
    .await;
    cancel.cancel();
    tokio::time::timeout(Duration::from_secs(15), serving)
        .await
        .expect("serve stops")
        .expect("serve task")
        .expect("serve shuts down cleanly");
    body
}

/// Names every expression may use besides what the processes export:
/// the recording rules and Prometheus' own `up`.
pub fn always_available() -> BTreeSet<String> {
    let mut names = recording_rule_names();
    names.extend(PROMETHEUS_BUILTINS.iter().map(|s| (*s).to_owned()));
    names
}

/// One line per expression that cannot be parsed or reads a name missing
/// from `exported` (pass [`always_available`] in it too).
pub fn unexported_names(exported: &BTreeSet<String>) -> Vec<String> {
    let mut problems = Vec::new();
    for (place, expr) in all_expressions() {
        match metric_names_used(&expr) {
            Err(e) => problems.push(format!("{place}: {e} in {expr:?}")),
            Ok(names) => {
                for name in names.difference(exported) {
                    problems.push(format!("{place}: {name} is not exported"));
                }
            }
        }
    }
    problems
}

/// One line per counter (or histogram series) read outside
/// `rate`/`increase`/`irate` of a range.
fn counter_misuse(place: &str, expr: &Expr, counters: &BTreeSet<String>) -> Vec<String> {
    selectors(expr)
        .into_iter()
        .filter(|s| s.name.as_ref().is_some_and(|n| counters.contains(n)))
        .filter(|s| {
            s.range.is_none() || !s.function.is_some_and(|f| COUNTER_FUNCTIONS.contains(&f))
        })
        .map(|s| {
            format!(
                "{place}: counter {} used outside rate/increase",
                s.name.unwrap_or_default()
            )
        })
        .collect()
}

// ------------------------------------------------------ dashboard lint

/// Problems of one dashboard, each naming the dashboard and the panel.
pub fn lint_dashboard(file: &str, dash: &Value) -> Vec<String> {
    let mut problems = Vec::new();
    let mut problem = |what: String| problems.push(format!("dashboards/{file}: {what}"));
    let ds_ok = |v: &Value| {
        v.get("type").and_then(Value::as_str) == Some("prometheus")
            && v.get("uid").and_then(Value::as_str) == Some("${datasource}")
    };

    if !dash.get("id").is_some_and(Value::is_null) {
        problem("\"id\" must be null".into());
    }
    let uid = dash.get("uid").and_then(Value::as_str).unwrap_or("");
    if uid.is_empty()
        || uid.len() > 40
        || !uid
            .chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
    {
        problem(format!(
            "uid {uid:?} must be a stable [a-z0-9-]{{1,40}} string"
        ));
    }
    if !dash
        .get("title")
        .and_then(Value::as_str)
        .is_some_and(|t| t.starts_with("BF4PS"))
    {
        problem("title must start with BF4PS".into());
    }
    if dash.get("schemaVersion").and_then(Value::as_u64) != Some(39) {
        problem("schemaVersion must be 39".into());
    }
    if !dash["tags"]
        .as_array()
        .is_some_and(|t| t.iter().any(|t| t == "bf4ps"))
    {
        problem("tags must include \"bf4ps\" (the dashboard links use it)".into());
    }

    let vars = dash["templating"]["list"]
        .as_array()
        .cloned()
        .unwrap_or_default();
    let var = |name: &str| vars.iter().find(|v| v["name"] == name);
    match var("datasource") {
        Some(v) if v["type"] == "datasource" && v["query"] == "prometheus" => {}
        _ => problem("needs a variable `datasource` of type datasource, query prometheus".into()),
    }
    for name in ["job", "instance"] {
        match var(name) {
            Some(v)
                if v["type"] == "query"
                    && v["definition"]
                        .as_str()
                        .is_some_and(|q| q.starts_with("label_values(")) => {}
            _ => problem(format!(
                "needs a query variable `{name}` using label_values(...)"
            )),
        }
    }
    for v in vars.iter().filter(|v| v["type"] == "query") {
        if !ds_ok(&v["datasource"]) {
            problem(format!(
                "variable {} must use datasource ${{datasource}}",
                v["name"]
            ));
        }
    }

    let counters = counter_series();
    let mut ids = BTreeSet::new();
    for panel in panels(dash) {
        if panel["type"] == "row" {
            continue;
        }
        let title = panel_title(panel);
        let mut problem = |what: String| {
            problems.push(format!("dashboards/{file} / panel {title:?}: {what}"));
        };
        if let Some(id) = panel["id"].as_u64() {
            if !ids.insert(id) {
                problem(format!("duplicate panel id {id}"));
            }
        } else {
            problem("needs a numeric id".into());
        }
        if panel["gridPos"]["w"].as_u64().is_none() || panel["gridPos"]["h"].as_u64().is_none() {
            problem("needs a gridPos with w and h".into());
        }
        if title == "<untitled>" || title.trim().is_empty() {
            problem("needs a title".into());
        }
        if panel["description"]
            .as_str()
            .is_none_or(|d| d.trim().is_empty())
        {
            problem("needs a description".into());
        }
        if panel["fieldConfig"]["defaults"]["unit"]
            .as_str()
            .is_none_or(|u| u.trim().is_empty())
        {
            problem("needs a unit (fieldConfig.defaults.unit)".into());
        }
        if !ds_ok(&panel["datasource"]) {
            problem("datasource must be {type: prometheus, uid: ${datasource}}".into());
        }
        let targets = panel["targets"].as_array().cloned().unwrap_or_default();
        if targets.is_empty() {
            problem("has no targets".into());
        }
        let mut ref_ids = BTreeSet::new();
        for target in &targets {
            let ref_id = target["refId"].as_str().unwrap_or("");
            if ref_id.is_empty() || !ref_ids.insert(ref_id.to_owned()) {
                problem(format!("target refId {ref_id:?} missing or duplicated"));
            }
            if !ds_ok(&target["datasource"]) {
                problem(format!(
                    "target {ref_id}: datasource must be ${{datasource}}"
                ));
            }
            let Some(expr) = target["expr"].as_str().filter(|e| !e.trim().is_empty()) else {
                problem(format!("target {ref_id}: no expr"));
                continue;
            };
            let parsed = match parse_promql(expr) {
                Ok(p) => p,
                Err(e) => {
                    problem(format!("target {ref_id}: does not parse: {e}"));
                    continue;
                }
            };
            for m in counter_misuse(&format!("target {ref_id}"), &parsed, &counters) {
                problem(m);
            }
            for s in selectors(&parsed) {
                let name = s.name.clone().unwrap_or_default();
                if s.function.is_some_and(|f| COUNTER_FUNCTIONS.contains(&f))
                    && s.range.is_some_and(|r| r != RATE_INTERVAL_SENTINEL)
                {
                    problem(format!(
                        "target {ref_id}: {name}: rate/increase range must be $__rate_interval"
                    ));
                }
                // Recorded series carry no job/instance; everything else is
                // filtered by the dashboard's variables.
                if !name.contains(':') {
                    for (label, var) in [("job", "grafana_job"), ("instance", "grafana_instance")] {
                        let filtered = s
                            .matchers
                            .iter()
                            .any(|(l, op, v)| l == label && op == "=~" && v == var);
                        if !filtered {
                            problem(format!(
                                "target {ref_id}: {name} must be filtered by {label}=~\"${label}\""
                            ));
                        }
                    }
                }
            }
        }
    }
    problems
}

// --------------------------------------------------------------- promtool

fn promtool(args: &[&str]) {
    let output = Command::new("promtool")
        .args(args)
        .current_dir(repo())
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run promtool ({e}): install Debian's `prometheus` package (scripts/test does)")
        });
    assert!(
        output.status.success(),
        "promtool {} failed ({}):\n{}{}",
        args.join(" "),
        output.status,
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn rel(path: &Path) -> String {
    path.strip_prefix(repo())
        .unwrap_or(path)
        .to_string_lossy()
        .into_owned()
}

// ------------------------------------------------------------------ tests

#[test]
fn promtool_checks_the_rules_with_lint() {
    promtool(&["check", "rules", "--lint=all", "--lint-fatal", RULES_FILE]);
}

#[test]
fn promtool_unit_tests_pass() {
    let tests: Vec<String> = files("alerts/tests", ".test.yml")
        .iter()
        .map(|p| rel(p))
        .collect();
    let mut args = vec!["test", "rules"];
    args.extend(tests.iter().map(String::as_str));
    promtool(&args);
}

#[test]
fn example_prometheus_config_is_valid_and_loads_the_rules() {
    promtool(&["check", "config", "docs/prometheus.yml"]);
    let config: serde_yaml_ng::Value =
        serde_yaml_ng::from_str(&read(&repo().join("docs/prometheus.yml"))).expect("YAML");
    let rule_files: Vec<&str> = config["rule_files"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|v| v.as_str())
        .collect();
    assert_eq!(rule_files, ["../alerts/bf4ps.rules.yml"]);
    let jobs: BTreeSet<&str> = config["scrape_configs"]
        .as_sequence()
        .into_iter()
        .flatten()
        .filter_map(|c| c["job_name"].as_str())
        .collect();
    assert_eq!(jobs, BTreeSet::from(["bf4ps-serve", "bf4ps-collector"]));
}

#[test]
fn alerts_follow_conventions_and_have_runbook_sections() {
    let runbook = read(&repo().join("docs/runbook.md"));
    let headings: BTreeSet<&str> = runbook
        .lines()
        .filter_map(|l| l.strip_prefix("## "))
        .map(str::trim)
        .collect();
    let mut problems = Vec::new();
    let mut alerts = BTreeSet::new();
    for rule in rules().groups.iter().flat_map(|g| &g.rules) {
        match (&rule.alert, &rule.record) {
            (Some(name), None) => {
                alerts.insert(name.clone());
                let camel = name.strip_prefix("BF4PS").is_some_and(|rest| {
                    rest.starts_with(|c: char| c.is_ascii_uppercase())
                        && rest.chars().all(|c| c.is_ascii_alphanumeric())
                });
                if !camel {
                    problems.push(format!("{name}: alert names are BF4PS + CamelCase"));
                }
                if rule
                    .for_
                    .as_deref()
                    .is_none_or(|f| f.is_empty() || f == "0s")
                {
                    problems.push(format!(
                        "{name}: needs a `for:` so one evaluation cannot page"
                    ));
                }
                let severity = rule.labels.get("severity").map(String::as_str);
                if !matches!(severity, Some("critical" | "warning" | "info")) {
                    problems.push(format!(
                        "{name}: severity {severity:?} not critical|warning|info"
                    ));
                }
                let ann = |k: &str| rule.annotations.get(k).map(String::as_str).unwrap_or("");
                if ann("summary").is_empty() || ann("summary").contains("{{") {
                    problems.push(format!("{name}: summary must be a static sentence"));
                }
                if !ann("description").contains("{{") {
                    problems.push(format!("{name}: description must be templated"));
                }
                let url = format!("{RUNBOOK_URL}#{}", name.to_lowercase());
                if ann("runbook_url") != url {
                    problems.push(format!("{name}: runbook_url must be {url}"));
                }
                if !headings.contains(name.as_str()) {
                    problems.push(format!(
                        "{name}: docs/runbook.md needs a section `## {name}`"
                    ));
                }
            }
            (None, Some(name)) => {
                let parts: Vec<&str> = name.split(':').collect();
                let ok = parts.len() == 3
                    && parts[0] == "bf4ps"
                    && parts.iter().all(|p| {
                        !p.is_empty()
                            && p.chars()
                                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
                    });
                if !ok {
                    problems.push(format!(
                        "{name}: recording rules are bf4ps:<metric>:<operations>"
                    ));
                }
            }
            _ => problems.push(format!("{}: exactly one of alert/record", rule.name())),
        }
    }
    for heading in headings.iter().filter(|h| h.starts_with("BF4PS")) {
        if !alerts.contains(*heading) {
            problems.push(format!("docs/runbook.md: section {heading} has no alert"));
        }
    }
    assert!(
        problems.is_empty(),
        "rule problems:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_alert_has_firing_and_silent_promtool_cases() {
    let alerts: BTreeSet<String> = rules()
        .groups
        .iter()
        .flat_map(|g| &g.rules)
        .filter_map(|r| r.alert.clone())
        .collect();
    let (mut fires, mut silent) = (BTreeSet::new(), BTreeSet::new());
    for path in files("alerts/tests", ".test.yml") {
        let doc: serde_yaml_ng::Value = serde_yaml_ng::from_str(&read(&path))
            .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        for test in doc["tests"].as_sequence().into_iter().flatten() {
            for case in test["alert_rule_test"].as_sequence().into_iter().flatten() {
                let name = case["alertname"].as_str().unwrap_or_default().to_owned();
                let expected = case["exp_alerts"].as_sequence().map_or(0, Vec::len);
                let exact = case["exp_alerts"]
                    .as_sequence()
                    .into_iter()
                    .flatten()
                    .all(|a| {
                        a["exp_labels"].as_mapping().is_some()
                            && a["exp_annotations"].as_mapping().is_some()
                    });
                assert!(
                    exact,
                    "{}: {name}: give exp_labels and exp_annotations",
                    rel(&path)
                );
                if expected > 0 {
                    &mut fires
                } else {
                    &mut silent
                }
                .insert(name);
            }
        }
    }
    let missing_fire: Vec<_> = alerts.difference(&fires).collect();
    let missing_silent: Vec<_> = alerts.difference(&silent).collect();
    assert!(
        missing_fire.is_empty(),
        "alerts never tested firing: {missing_fire:?}"
    );
    assert!(
        missing_silent.is_empty(),
        "alerts never tested silent: {missing_silent:?}"
    );
}

/// Every name a dashboard or rule reads is exported by a real process: the
/// `/metrics` a running `serve` renders, what a collector renders, plus the
/// recording rules and `up`. And the catalog (which the lint and the
/// counter check rely on) agrees with those expositions, family by family.
#[sqlx::test]
async fn every_expression_reads_names_the_processes_export(
    _: PgPoolOptions,
    opts: PgConnectOptions,
) {
    let db = TestDb::new(opts).await;
    let serve = serve_exposition(&db).await;
    let collector = collector_exposition();
    let mut exported = exposition_exported(&serve);
    exported.extend(exposition_exported(&collector));
    exported.extend(always_available());
    let problems = unexported_names(&exported);
    assert!(
        problems.is_empty(),
        "names used but exported by neither serve nor collectors:\n{}",
        problems.join("\n")
    );
    let problems = catalog_disagreements(&serve, &collector);
    assert!(
        problems.is_empty(),
        "the catalog and the real expositions disagree:\n{}",
        problems.join("\n")
    );
    // The check can fail, naming the place: drop one used name.
    exported.remove("bf4ps_collector_busy");
    let problems = unexported_names(&exported);
    assert!(
        problems.iter().any(|p| p.starts_with(
            "dashboards/fleet.json / panel \"Busy collectors\" / A: bf4ps_collector_busy"
        )),
        "{problems:?}"
    );
}

#[test]
fn rules_read_counters_only_through_rate_or_increase() {
    let counters = counter_series();
    let mut problems = Vec::new();
    for group in rules().groups {
        for rule in &group.rules {
            let place = format!("{RULES_FILE} / {}", rule.name());
            match parse_promql(&rule.expr) {
                Ok(expr) => problems.extend(counter_misuse(&place, &expr, &counters)),
                Err(e) => problems.push(format!("{place}: {e}")),
            }
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn dashboards_follow_conventions() {
    let dashboards = dashboards();
    let mut problems: Vec<String> = dashboards
        .iter()
        .flat_map(|(file, dash)| lint_dashboard(file, dash))
        .collect();
    let mut uids = BTreeMap::new();
    for (file, dash) in &dashboards {
        let uid = dash["uid"].as_str().unwrap_or_default();
        if let Some(other) = uids.insert(uid.to_owned(), file.clone()) {
            problems.push(format!(
                "dashboards/{file}: uid {uid:?} also used by {other}"
            ));
        }
    }
    for wanted in [
        "bf4ps-fleet",
        "bf4ps-queue",
        "bf4ps-freshness",
        "bf4ps-projector",
    ] {
        if !uids.contains_key(wanted) {
            problems.push(format!("missing dashboard with uid {wanted}"));
        }
    }
    assert!(
        problems.is_empty(),
        "dashboard problems:\n{}",
        problems.join("\n")
    );
}

#[test]
fn every_catalog_family_is_on_a_dashboard() {
    let mut used = BTreeSet::new();
    for (file, dash) in dashboards() {
        for panel in panels(&dash) {
            for target in panel["targets"].as_array().into_iter().flatten() {
                if let Some(expr) = target["expr"].as_str() {
                    let names = metric_names_used(expr)
                        .unwrap_or_else(|e| panic!("{file} / {}: {e}", panel_title(panel)));
                    used.extend(names);
                }
            }
        }
    }
    let missing: Vec<&str> = CATALOG
        .iter()
        .map(|m| m.name)
        .filter(|name| {
            !used.iter().any(|u| {
                u == name
                    || u.strip_prefix(name)
                        .is_some_and(|s| ["_bucket", "_sum", "_count"].contains(&s))
            })
        })
        .collect();
    assert!(
        missing.is_empty(),
        "metric families on no dashboard: {missing:?}"
    );
}

#[test]
fn grafana_provisioning_is_well_formed() {
    let yaml = |rel: &str| -> serde_yaml_ng::Value {
        serde_yaml_ng::from_str(&read(&repo().join(rel))).unwrap_or_else(|e| panic!("{rel}: {e}"))
    };
    let dashboards = yaml("dashboards/provisioning/dashboards/bf4ps.yml");
    assert_eq!(dashboards["apiVersion"].as_u64(), Some(1));
    let provider = &dashboards["providers"][0];
    assert_eq!(provider["type"].as_str(), Some("file"));
    assert!(
        provider["options"]["path"]
            .as_str()
            .is_some_and(|p| p.starts_with('/'))
    );

    let datasources = yaml("dashboards/provisioning/datasources/prometheus.yml");
    assert_eq!(datasources["apiVersion"].as_u64(), Some(1));
    let ds = &datasources["datasources"][0];
    assert_eq!(ds["type"].as_str(), Some("prometheus"));
    assert!(ds["uid"].as_str().is_some_and(|u| !u.is_empty()));
    assert!(ds["url"].as_str().is_some_and(|u| u.starts_with("http")));
    // $__rate_interval is derived from the scrape interval Grafana is told.
    assert_eq!(ds["jsonData"]["timeInterval"].as_str(), Some("15s"));
}

// ----------------------------------------------- the checker's own tests

#[test]
fn grafana_variables_are_substituted() {
    assert_eq!(
        substitute_grafana_variables(
            r#"sum(rate(x{job=~"$job", lane=~"${lane:regex}", i=~"[[instance]]"}[$__rate_interval])) $x"#
        ),
        r#"sum(rate(x{job=~"grafana_job", lane=~"grafana_lane", i=~"grafana_instance"}[12345s])) grafana_x"#
    );
    assert_eq!(
        substitute_grafana_variables("x[5m] offset $__interval"),
        "x[5m] offset 60s"
    );
}

#[test]
fn metric_names_are_collected_from_every_selector() {
    let names = metric_names_used(
        r#"histogram_quantile(0.95, sum by (le) (rate(a_bucket{job=~"$job"}[$__rate_interval])))
           / on () group_left max(b) or vector(0) unless {__name__="c"} and time() - d > 0"#,
    )
    .expect("parses");
    assert_eq!(
        names,
        BTreeSet::from(["a_bucket", "b", "c", "d"].map(String::from))
    );
    assert!(metric_names_used(r#"{__name__=~"bf4ps_.*"}"#).is_err());
    assert!(metric_names_used("sum(").is_err());
}

#[test]
fn exposition_names_include_histogram_series() {
    let text = "# HELP bf4ps_x_seconds X.\n# TYPE bf4ps_x_seconds histogram\n\
                bf4ps_x_seconds_bucket{le=\"1\"} 0\n# TYPE bf4ps_y_total counter\n\
                bf4ps_y_total{a=\"b\"} 3\nbf4ps_z 1\n";
    let names = exposition_exported(text);
    for n in [
        "bf4ps_x_seconds_bucket",
        "bf4ps_x_seconds_sum",
        "bf4ps_x_seconds_count",
        "bf4ps_y_total",
        "bf4ps_z",
    ] {
        assert!(names.contains(n), "{n} in {names:?}");
    }
    assert!(!names.contains("bf4ps_x_seconds"));
    assert_eq!(
        exposition_families(text)
            .get("bf4ps_x_seconds")
            .map(String::as_str),
        Some("histogram")
    );
    assert_eq!(
        families_without_samples("bf4ps_build_info{version=\"1\"} 1\n", Exporter::Any),
        ["bf4ps_listener_reconnects_total"]
    );
}

#[test]
fn the_lint_names_dashboard_and_panel_of_each_problem() {
    let good = &dashboards()[0].1;
    let mut bad = good.clone();
    let panel = &mut bad["panels"][0];
    panel["title"] = "Broken".into();
    panel["description"] = "".into();
    panel["fieldConfig"]["defaults"]["unit"] = Value::Null;
    panel["datasource"]["uid"] = "prometheus".into();
    panel["targets"] = serde_json::json!([
        {"refId": "A", "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "expr": "sum(bf4ps_retention_deleted_events_total{job=~\"$job\", instance=~\"$instance\"})"},
        {"refId": "B", "datasource": {"type": "prometheus", "uid": "${datasource}"},
         "expr": "sum(rate(bf4ps_egress_requests_total{job=~\"$job\"}[5m]))"},
    ]);
    bad["id"] = 7.into();
    let problems = lint_dashboard("x.json", &bad).join("\n");
    for expected in [
        "dashboards/x.json: \"id\" must be null",
        "dashboards/x.json / panel \"Broken\": needs a description",
        "dashboards/x.json / panel \"Broken\": needs a unit",
        "dashboards/x.json / panel \"Broken\": datasource must be",
        "panel \"Broken\": target A: counter bf4ps_retention_deleted_events_total used outside rate/increase",
        "panel \"Broken\": target B: bf4ps_egress_requests_total: rate/increase range must be $__rate_interval",
        "panel \"Broken\": target B: bf4ps_egress_requests_total must be filtered by instance=~\"$instance\"",
    ] {
        assert!(
            problems.contains(expected),
            "missing {expected:?} in:\n{problems}"
        );
    }
    assert!(lint_dashboard("good.json", good).is_empty());
}
