//! The Battlelog HTTP client: fetches one resource (`detailed`, `profile`,
//! `weapons`, `vehicles`) of one soldier, classifies every failure into an
//! [`ErrorClass`], and normalizes a successful body into a stable JSON shape.
//!
//! Invariants:
//! - One pooled `reqwest::Client` per [`Upstream`]; every request is bounded
//!   by the request timeout (connect, headers and body together) and the
//!   connect timeout.
//! - A fetch ends in exactly one of [`Fetched`] (normalized data) or
//!   [`FetchFailure`] (a class). A 2xx body that does not parse, or lacks a
//!   required field, is a `parse` failure, never an empty or zero result.
//! - Redirects are never followed (every request Battlelog sees passed the
//!   egress gate): a 3xx is an `http` failure. Classes of statuses are in
//!   [`classify_status`]; of 2xx bodies in [`battlelog`].
//! - Failure messages are our own words plus status/reason, at most
//!   [`MAX_MESSAGE_CHARS`] characters, and never contain any part of a
//!   response body (not even Battlelog's envelope `message`).
//! - Normalized data is deterministic: the same upstream stats always give
//!   the same JSON value (lists sorted, ratios rounded), so a content hash
//!   changes only when the stats do. See [`battlelog`] for the shapes.

pub mod battlelog;

use std::time::{Duration, Instant};

use crate::config::{ConfigError, err, fmt_duration, positive};
use crate::domain::{ErrorClass, Platform, Resource};

/// Longest [`FetchFailure::message`], in characters.
pub const MAX_MESSAGE_CHARS: usize = 200;

/// Largest response body read; a longer one is a `parse` failure. Real
/// weapon/vehicle bodies are about 0.6 MB.
pub(crate) const MAX_BODY_BYTES: usize = 16 * 1024 * 1024;

/// Battlelog's numeric platform id (`platformInt`): pc=1, ps4=32, xboxone=64.
pub const fn battlelog_platform_id(platform: Platform) -> u32 {
    match platform {
        Platform::Pc => 1,
        Platform::Ps4 => 32,
        Platform::XboxOne => 64,
    }
}

/// The platform with Battlelog id `id`, if it is one we collect.
pub fn platform_from_battlelog_id(id: u32) -> Option<Platform> {
    Platform::ALL
        .iter()
        .copied()
        .find(|p| battlelog_platform_id(*p) == id)
}

crate::config::settings! {
    /// Upstream (Battlelog) settings; flattened into subcommands that fetch.
    pub struct UpstreamSettings in upstream_setting {
        /// Base URL of Battlelog (http or https), without a trailing path for the resource.
        url: String = "https://battlelog.battlefield.com",
            "upstream-url", "BF4PS_UPSTREAM_URL", "Upstream";
        /// Whole-request timeout: connect, headers and body together.
        timeout: Duration = "30s", "upstream-timeout", "BF4PS_UPSTREAM_TIMEOUT", "Upstream";
        /// TCP/TLS connect timeout.
        connect_timeout: Duration = "5s",
            "upstream-connect-timeout", "BF4PS_UPSTREAM_CONNECT_TIMEOUT", "Upstream";
        /// User-Agent header sent with every request.
        user_agent: String = concat!("bf4ps-ops/", env!("CARGO_PKG_VERSION")),
            "upstream-user-agent", "BF4PS_UPSTREAM_USER_AGENT", "Upstream";
        /// Path of the `detailed` resource; placeholders {persona_id} and {platform_id}.
        path_detailed: String = "/bf4/warsawdetailedstatspopulate/{persona_id}/{platform_id}/",
            "path-detailed", "BF4PS_PATH_DETAILED", "Upstream";
        /// Path of the `profile` resource, the Battlelog user page of the soldier's
        /// account; placeholder {name} (the soldier's current name, URL-encoded).
        path_profile: String = "/bf4/user/{name}/",
            "path-profile", "BF4PS_PATH_PROFILE", "Upstream";
        /// Path of the `weapons` resource; placeholders {persona_id} and {platform_id}.
        path_weapons: String = "/bf4/warsawWeaponsPopulateStats/{persona_id}/{platform_id}/stats/",
            "path-weapons", "BF4PS_PATH_WEAPONS", "Upstream";
        /// Path of the `vehicles` resource; placeholders {persona_id} and {platform_id}.
        path_vehicles: String = "/bf4/warsawvehiclesPopulateStats/{persona_id}/{platform_id}/stats/",
            "path-vehicles", "BF4PS_PATH_VEHICLES", "Upstream";
    }
}

impl UpstreamSettings {
    /// The same settings pointed at another base URL (tests, demo).
    pub fn with_url(url: impl Into<String>) -> UpstreamSettings {
        UpstreamSettings {
            url: url.into(),
            ..UpstreamSettings::default()
        }
    }

    /// The path template of `resource`.
    pub fn path_template(&self, resource: Resource) -> &str {
        match resource {
            Resource::Detailed => &self.path_detailed,
            Resource::Profile => &self.path_profile,
            Resource::Weapons => &self.path_weapons,
            Resource::Vehicles => &self.path_vehicles,
        }
    }

    /// Checks every value; the error names the flag and environment variable.
    pub fn validate(&self) -> Result<(), ConfigError> {
        use upstream_setting::label;
        base_url(&self.url)?;
        positive(label::timeout, self.timeout)?;
        positive(label::connect_timeout, self.connect_timeout)?;
        if self.user_agent.trim().is_empty()
            || !self.user_agent.bytes().all(|b| (b' '..=b'~').contains(&b))
        {
            return Err(err(label::user_agent, "must be non-empty printable ASCII"));
        }
        for (setting, resource) in [
            (label::path_detailed, Resource::Detailed),
            (label::path_profile, Resource::Profile),
            (label::path_weapons, Resource::Weapons),
            (label::path_vehicles, Resource::Vehicles),
        ] {
            check_template(setting, self.path_template(resource))?;
        }
        Ok(())
    }
}

/// The base URL without a trailing slash, or an error naming the setting.
fn base_url(text: &str) -> Result<String, ConfigError> {
    let url = reqwest::Url::parse(text.trim()).map_err(|e| {
        err(
            upstream_setting::label::url,
            format!("{text:?} is not a URL ({e})"),
        )
    })?;
    if !matches!(url.scheme(), "http" | "https") {
        return Err(err(
            upstream_setting::label::url,
            format!("{text:?} must use http or https, not {}", url.scheme()),
        ));
    }
    if url.host_str().is_none_or(str::is_empty) {
        return Err(err(
            upstream_setting::label::url,
            format!("{text:?} has no host"),
        ));
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err(err(
            upstream_setting::label::url,
            format!("{text:?} must not have a query or fragment"),
        ));
    }
    Ok(url.as_str().trim_end_matches('/').to_owned())
}

/// A template must be an absolute path naming the soldier (`{persona_id}`
/// or `{name}`), with no placeholder other than `{persona_id}`,
/// `{platform_id}` and `{name}`.
fn check_template(setting: &'static str, template: &str) -> Result<(), ConfigError> {
    if !template.starts_with('/') {
        return Err(err(setting, format!("{template:?} must start with '/'")));
    }
    if !template.contains("{persona_id}") && !template.contains("{name}") {
        return Err(err(
            setting,
            format!("{template:?} lacks the {{persona_id}} (or {{name}}) placeholder"),
        ));
    }
    let rest = template
        .replace("{persona_id}", "")
        .replace("{platform_id}", "")
        .replace("{name}", "");
    if rest.contains('{') || rest.contains('}') {
        return Err(err(
            setting,
            format!(
                "{template:?} has an unknown placeholder (known: {{persona_id}}, {{platform_id}}, \
                 {{name}})"
            ),
        ));
    }
    if template
        .chars()
        .any(|c| c.is_whitespace() || c == '?' || c == '#')
    {
        return Err(err(
            setting,
            format!("{template:?} must be a plain path (no spaces, query or fragment)"),
        ));
    }
    Ok(())
}

/// Settings that cannot make a working client.
#[derive(Debug, thiserror::Error)]
pub enum UpstreamConfigError {
    /// A setting is out of range; names the flag and environment variable.
    #[error(transparent)]
    Invalid(#[from] ConfigError),
    /// The HTTP client could not be built (TLS set-up).
    #[error("cannot build the Battlelog HTTP client: {0}")]
    Client(String),
}

/// A successful fetch.
#[derive(Debug, Clone, PartialEq)]
pub struct Fetched {
    /// Normalized data (see [`battlelog`] for the shape per resource).
    pub data: serde_json::Value,
    /// HTTP status (2xx).
    pub http_status: u16,
    /// From sending the request to the last body byte.
    pub duration: Duration,
    /// Size of the raw response body.
    pub body_bytes: usize,
}

/// A failed fetch, classified.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{class}: {message}")]
pub struct FetchFailure {
    /// Why it failed; `class.is_retryable()` decides retry vs terminal.
    pub class: ErrorClass,
    /// The HTTP status, when a response head arrived.
    pub http_status: Option<u16>,
    /// Short, in our own words; never any part of the response body.
    pub message: String,
    /// From sending the request to the failure.
    pub duration: Duration,
}

/// The Battlelog client: one connection pool, validated settings.
#[derive(Debug, Clone)]
pub struct Upstream {
    client: reqwest::Client,
    base: String,
    settings: UpstreamSettings,
}

impl Upstream {
    /// Validates `settings` and builds the pooled client.
    pub fn new(settings: &UpstreamSettings) -> Result<Upstream, UpstreamConfigError> {
        settings.validate()?;
        let base = base_url(&settings.url)?;
        // reqwest is built without a bundled TLS provider; install ring once
        // per process (a no-op if one is installed already).
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .user_agent(settings.user_agent.clone())
            .timeout(settings.timeout)
            .connect_timeout(settings.connect_timeout)
            .pool_idle_timeout(Duration::from_secs(30))
            // Never follow a redirect: its target would be a request the
            // egress gate never granted. A 3xx is an `http` failure.
            .redirect(reqwest::redirect::Policy::none())
            .tcp_nodelay(true)
            .build()
            .map_err(|e| UpstreamConfigError::Client(crate::telemetry::error_chain(&e)))?;
        Ok(Upstream {
            client,
            base,
            settings: settings.clone(),
        })
    }

    /// The full URL fetched for one soldier's resource (`name`, the
    /// soldier's current name, only for templates with `{name}`).
    pub(crate) fn url_for(
        &self,
        platform: Platform,
        persona_id: i64,
        name: &str,
        resource: Resource,
    ) -> String {
        let path = self
            .settings
            .path_template(resource)
            .replace("{persona_id}", &persona_id.to_string())
            .replace(
                "{platform_id}",
                &battlelog_platform_id(platform).to_string(),
            )
            .replace("{name}", &encode_path_segment(name));
        format!("{}{path}", self.base)
    }

    /// Fetches and normalizes one resource. Never panics; every failure is
    /// classified (see the module doc). A user page (`profile`) that
    /// Battlelog answers with 404 is data, not a failure: BF4PS's
    /// `not_found` access state.
    pub async fn fetch(
        &self,
        platform: Platform,
        persona_id: i64,
        name: &str,
        resource: Resource,
    ) -> Result<Fetched, FetchFailure> {
        let url = self.url_for(platform, persona_id, name, resource);
        let started = Instant::now();
        let fail = |class, http_status, message: String| FetchFailure {
            class,
            http_status,
            message: short(message),
            duration: started.elapsed(),
        };

        let accept = match resource {
            Resource::Profile => "text/html",
            _ => "application/json",
        };
        let (status, body) = match self.exchange(&url, accept).await {
            Ok(v) => v,
            Err((ErrorClass::Unavailable, Some(404), _)) if resource == Resource::Profile => {
                let data =
                    serde_json::to_value(battlelog::Profile::not_found(name)).unwrap_or_default();
                return Ok(Fetched {
                    data,
                    http_status: 404,
                    duration: started.elapsed(),
                    body_bytes: 0,
                });
            }
            Err((class, status, message)) => return Err(fail(class, status, message)),
        };
        match battlelog::normalize(resource, platform, persona_id, name, &body) {
            Ok(data) => Ok(Fetched {
                data,
                http_status: status,
                duration: started.elapsed(),
                body_bytes: body.len(),
            }),
            Err(e) => Err(fail(
                e.class,
                Some(status),
                format!("{resource}: {}", e.message),
            )),
        }
    }

    /// Sends the request and reads a 2xx body; any other outcome is a
    /// classified failure `(class, status, message)`.
    async fn exchange(
        &self,
        url: &str,
        accept: &str,
    ) -> Result<(u16, Vec<u8>), (ErrorClass, Option<u16>, String)> {
        let mut response = self
            .client
            .get(url)
            .header(reqwest::header::ACCEPT, accept)
            .send()
            .await
            .map_err(|e| {
                let (class, message) = self.classify_error(&e);
                (class, None, message)
            })?;
        let status = response.status();
        if let Some(class) = classify_status(status.as_u16()) {
            // The body is never read: nothing of it can reach a message.
            return Err((class, Some(status.as_u16()), status_message(status)));
        }
        let mut body = Vec::with_capacity(
            response
                .content_length()
                .map_or(8 * 1024, |n| n.min(MAX_BODY_BYTES as u64) as usize),
        );
        loop {
            match response.chunk().await {
                Ok(Some(chunk)) => {
                    if body.len() + chunk.len() > MAX_BODY_BYTES {
                        return Err((
                            ErrorClass::Parse,
                            Some(status.as_u16()),
                            format!("body exceeds {} MiB", MAX_BODY_BYTES / (1024 * 1024)),
                        ));
                    }
                    body.extend_from_slice(&chunk);
                }
                Ok(None) => break,
                Err(e) => {
                    let (class, message) = self.classify_error(&e);
                    return Err((
                        class,
                        Some(status.as_u16()),
                        format!("reading body: {message}"),
                    ));
                }
            }
        }
        Ok((status.as_u16(), body))
    }

    /// Transport-level errors: a timeout (connect or whole request) is
    /// `timeout`; everything else that kept a response from completing
    /// (refused, reset, DNS, TLS, closed mid-message) is `transport`.
    fn classify_error(&self, e: &reqwest::Error) -> (ErrorClass, String) {
        if e.is_timeout() {
            let message = if e.is_connect() {
                format!(
                    "connect timed out after {}",
                    fmt_duration(self.settings.connect_timeout)
                )
            } else {
                format!(
                    "no complete response within {}",
                    fmt_duration(self.settings.timeout)
                )
            };
            return (ErrorClass::Timeout, message);
        }
        let what = if e.is_connect() {
            "cannot connect"
        } else if e.is_body() || e.is_decode() {
            "body transfer failed"
        } else {
            "request failed"
        };
        (ErrorClass::Transport, format!("{what}: {}", root_cause(e)))
    }
}

/// The class of a non-2xx HTTP status, `None` for 2xx.
///
/// - 401, 403, 429 → `throttled` (retryable; the egress key pauses): an edge
///   block or a throttle, never a fact about the persona;
/// - 404, 410 → `unavailable` (terminal): the resource does not exist;
/// - 408 → `timeout`; 5xx → `server`;
/// - 3xx (redirects are never followed), other 4xx and anything else →
///   `http` (retryable).
pub(crate) fn classify_status(status: u16) -> Option<ErrorClass> {
    match status {
        200..=299 => None,
        401 | 403 | 429 => Some(ErrorClass::Throttled),
        404 | 410 => Some(ErrorClass::Unavailable),
        408 => Some(ErrorClass::Timeout),
        500..=599 => Some(ErrorClass::Server),
        _ => Some(ErrorClass::Http),
    }
}

/// Our words for a status: its number and standard reason phrase (never
/// the reason or headers the server sent).
fn status_message(status: reqwest::StatusCode) -> String {
    let mut text = match status.canonical_reason() {
        Some(reason) => format!("HTTP {} {reason}", status.as_u16()),
        None => format!("HTTP {}", status.as_u16()),
    };
    if status.is_redirection() {
        text.push_str(" (redirects are not followed)");
    }
    text
}

/// The innermost cause (e.g. "Connection refused (os error 111)"): errors
/// from the network stack, never from the body.
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cur = e;
    while let Some(next) = cur.source() {
        cur = next;
    }
    cur.to_string()
}

/// `text` as one URL path segment: unreserved characters as they are,
/// every other byte percent-encoded.
fn encode_path_segment(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for b in text.trim().bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.' | b'~') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Truncates to [`MAX_MESSAGE_CHARS`] characters.
fn short(message: String) -> String {
    if message.chars().count() <= MAX_MESSAGE_CHARS {
        return message;
    }
    let mut cut: String = message.chars().take(MAX_MESSAGE_CHARS - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_classify() {
        use ErrorClass::*;
        let cases: &[(u16, Option<ErrorClass>)] = &[
            (200, None),
            (204, None),
            (301, Some(Http)),
            (302, Some(Http)),
            (304, Some(Http)),
            (307, Some(Http)),
            (400, Some(Http)),
            (401, Some(Throttled)),
            (403, Some(Throttled)),
            (404, Some(Unavailable)),
            (405, Some(Http)),
            (408, Some(Timeout)),
            (410, Some(Unavailable)),
            (418, Some(Http)),
            (429, Some(Throttled)),
            (500, Some(Server)),
            (503, Some(Server)),
            (599, Some(Server)),
            (101, Some(Http)),
        ];
        for (status, class) in cases {
            assert_eq!(classify_status(*status), *class, "{status}");
        }
        assert!(!Unavailable.is_retryable());
        for class in [Parse, Throttled, Http, Server, Timeout, Transport] {
            assert!(class.is_retryable(), "{class}");
        }
    }

    #[test]
    fn platform_ids_round_trip() {
        assert_eq!(battlelog_platform_id(Platform::Pc), 1);
        assert_eq!(battlelog_platform_id(Platform::Ps4), 32);
        assert_eq!(battlelog_platform_id(Platform::XboxOne), 64);
        for p in Platform::ALL {
            assert_eq!(
                platform_from_battlelog_id(battlelog_platform_id(*p)),
                Some(*p)
            );
        }
        assert_eq!(platform_from_battlelog_id(2), None);
    }

    #[test]
    fn defaults_are_valid_and_render_real_paths() {
        let up = Upstream::new(&UpstreamSettings::default()).unwrap();
        assert_eq!(
            up.url_for(Platform::Ps4, 303498475, "x", Resource::Detailed),
            "https://battlelog.battlefield.com/bf4/warsawdetailedstatspopulate/303498475/32/"
        );
        assert_eq!(
            up.url_for(Platform::Pc, 7, "x", Resource::Weapons),
            "https://battlelog.battlefield.com/bf4/warsawWeaponsPopulateStats/7/1/stats/"
        );
        let up = Upstream::new(&UpstreamSettings::with_url("http://127.0.0.1:9/prefix/")).unwrap();
        assert_eq!(
            up.url_for(Platform::XboxOne, 5, "Ann Lee/ä", Resource::Profile),
            "http://127.0.0.1:9/prefix/bf4/user/Ann%20Lee%2F%C3%A4/"
        );
    }

    #[test]
    fn bad_settings_name_the_setting() {
        let cases: Vec<(UpstreamSettings, &str)> = vec![
            (
                UpstreamSettings::with_url("not a url"),
                "BF4PS_UPSTREAM_URL",
            ),
            (
                UpstreamSettings::with_url("ftp://example.com"),
                "BF4PS_UPSTREAM_URL",
            ),
            (
                UpstreamSettings::with_url("http://h/?q=1"),
                "BF4PS_UPSTREAM_URL",
            ),
            (
                UpstreamSettings {
                    timeout: Duration::ZERO,
                    ..UpstreamSettings::default()
                },
                "BF4PS_UPSTREAM_TIMEOUT",
            ),
            (
                UpstreamSettings {
                    connect_timeout: Duration::ZERO,
                    ..UpstreamSettings::default()
                },
                "BF4PS_UPSTREAM_CONNECT_TIMEOUT",
            ),
            (
                UpstreamSettings {
                    path_detailed: "/bf4/x/{platform_id}/".into(),
                    ..UpstreamSettings::default()
                },
                "BF4PS_PATH_DETAILED",
            ),
            (
                UpstreamSettings {
                    path_weapons: "/bf4/{persona_id}/{platfrom}/".into(),
                    ..UpstreamSettings::default()
                },
                "BF4PS_PATH_WEAPONS",
            ),
            (
                UpstreamSettings {
                    path_vehicles: "bf4/{persona_id}/".into(),
                    ..UpstreamSettings::default()
                },
                "BF4PS_PATH_VEHICLES",
            ),
            (
                UpstreamSettings {
                    user_agent: "bad\nagent".into(),
                    ..UpstreamSettings::default()
                },
                "BF4PS_UPSTREAM_USER_AGENT",
            ),
        ];
        for (args, env) in cases {
            let e = Upstream::new(&args).unwrap_err().to_string();
            assert!(e.contains(env), "{e} should name {env}");
        }
    }

    #[test]
    fn messages_are_bounded() {
        let long = "x".repeat(1000);
        let s = short(long);
        assert_eq!(s.chars().count(), MAX_MESSAGE_CHARS);
        assert_eq!(short("ok".into()), "ok");
    }
}
