//! Events, clock domains and the schema a region declares in its header.

use std::fmt;

/// Longest event or clock-domain name, in bytes of UTF-8.
pub const MAX_NAME_LEN: usize = crate::word::NAME_BYTES;
/// Most events a schema can declare.
pub const MAX_EVENTS: usize = crate::layout::MAX_EVENTS;
/// Most clock domains a region holds, declared at creation and registered at
/// run time together (the shared clock included).
pub const MAX_DOMAINS: usize = crate::word::MAX_DOMAINS;
/// The name of the shared clock domain: `CLOCK_MONOTONIC` of the creating
/// host, boot and time namespace. It is always domain 0.
pub const HOST_MONOTONIC: &str = "host_monotonic";

/// The four stream-edge events of the default schema, in schema order.
///
/// `Event` converts into an [`EventId`] by its position, so it names the
/// right event on any region created with [`Schema::stream_edges`] (the
/// default). For a custom schema use [`Schema::event`] or
/// [`Viewer::event`](crate::Viewer::event).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Event {
    /// Producer stage: the first meaningful payload for the edge is ready.
    ProducerFirstNonemptyEmit = 0,
    /// Producer side, connector send thread: the put of the first payload
    /// committed.
    EdgeFirstSendComplete = 1,
    /// Consumer stage, receive thread: the first payload was decoded and
    /// admitted.
    ConsumerFirstAccept = 2,
    /// Consumer stage: the first non-empty output.
    ConsumerFirstNonemptyOutput = 3,
}

impl Event {
    /// All four, in schema order.
    pub const ALL: [Event; 4] = [
        Event::ProducerFirstNonemptyEmit,
        Event::EdgeFirstSendComplete,
        Event::ConsumerFirstAccept,
        Event::ConsumerFirstNonemptyOutput,
    ];

    /// The event's name as it appears in snapshots.
    pub const fn name(self) -> &'static str {
        match self {
            Event::ProducerFirstNonemptyEmit => "producer_first_nonempty_emit",
            Event::EdgeFirstSendComplete => "edge_first_send_complete",
            Event::ConsumerFirstAccept => "consumer_first_accept",
            Event::ConsumerFirstNonemptyOutput => "consumer_first_nonempty_output",
        }
    }

    /// The event with this name, if it is one of the four.
    pub fn from_name(name: &str) -> Option<Event> {
        Event::ALL.into_iter().find(|e| e.name() == name)
    }
}

impl fmt::Display for Event {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The position of an event in a region's schema.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct EventId(pub u8);

impl From<Event> for EventId {
    fn from(e: Event) -> EventId {
        EventId(e as u8)
    }
}

/// The position of a clock domain in a region's domain table.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DomainId(pub u8);

impl DomainId {
    /// The shared clock, [`HOST_MONOTONIC`].
    pub const HOST_MONOTONIC: DomainId = DomainId(0);
}

/// One event of a schema.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventSpec {
    name: String,
    domain: DomainId,
    chunk_seq: bool,
}

impl EventSpec {
    /// The event's name; a snapshot shows its value as `<name>_ms`.
    pub fn name(&self) -> &str {
        &self.name
    }
    /// The clock domain the plain [`Recorder::record`](crate::Recorder::record)
    /// records this event in.
    pub fn domain(&self) -> DomainId {
        self.domain
    }
    /// Whether the winning write keeps its chunk sequence number (the
    /// snapshot's `first_chunk_seq`).
    pub fn keeps_chunk_seq(&self) -> bool {
        self.chunk_seq
    }
}

/// A region's schema: its events and its clock domains.
///
/// The default is [`Schema::stream_edges`].
///
/// ```
/// use edgemark::schema::Schema;
/// let schema = Schema::stream_edges().with_domain("sender").unwrap();
/// assert_eq!(schema.domains(), ["host_monotonic", "sender"]);
/// assert_eq!(schema.events().len(), 4);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Schema {
    events: Vec<EventSpec>,
    domains: Vec<String>,
}

/// Why a schema could not be built.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SchemaError {
    /// A name is empty or blank, longer than [`MAX_NAME_LEN`] bytes, or
    /// contains a control character (NUL, newline, escape, ...) or an
    /// invisible format character (a bidirectional control, a zero-width
    /// space, ...).
    BadName(String),
    /// The name is declared twice.
    Duplicate(String),
    /// More than [`MAX_EVENTS`] events.
    TooManyEvents,
    /// More than [`MAX_DOMAINS`] clock domains.
    TooManyDomains,
    /// An event names a clock domain the schema does not declare.
    UnknownDomain(String),
    /// A schema needs at least one event.
    NoEvents,
}

impl fmt::Display for SchemaError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            // `{:?}` escapes control characters, so a hostile name cannot
            // drive the terminal that shows this message.
            SchemaError::BadName(n) => write!(
                f,
                "bad name {n:?}: names are 1 to {MAX_NAME_LEN} bytes of UTF-8, not blank, \
                 without control or invisible format characters (such as bidirectional controls)"
            ),
            SchemaError::Duplicate(n) => write!(f, "name {n:?} is declared twice"),
            SchemaError::TooManyEvents => {
                write!(f, "too many events: a schema holds at most {MAX_EVENTS}")
            }
            SchemaError::TooManyDomains => write!(
                f,
                "too many clock domains: a region holds at most {MAX_DOMAINS}"
            ),
            SchemaError::UnknownDomain(n) => write!(f, "clock domain {n:?} is not declared"),
            SchemaError::NoEvents => write!(f, "a schema needs at least one event"),
        }
    }
}

impl std::error::Error for SchemaError {}

/// Whether `name` can name an event or clock domain: 1 to
/// [`MAX_NAME_LEN`] bytes, not only white space, no control character and
/// no invisible format character ([`is_format`]). Allocates nothing (the
/// record path calls it).
pub(crate) fn valid_name(name: &str) -> bool {
    !name.trim().is_empty()
        && name.len() <= MAX_NAME_LEN
        && !name.chars().any(|c| c.is_control() || is_format(c))
}

/// Whether `c` is a Unicode format character (general category `Cf`) or a
/// line or paragraph separator: invisible characters that change how the
/// text around them is shown. The bidirectional controls (U+202A..U+202E,
/// U+2066..U+2069, the marks U+200E, U+200F, U+061C) can make a name read
/// as another in a terminal or a page (`\u{202e}evil` shows as `live`);
/// zero-width ones make two names that look alike differ.
fn is_format(c: char) -> bool {
    matches!(
        c,
        '\u{00ad}'
            | '\u{0600}'..='\u{0605}'
            | '\u{061c}'
            | '\u{06dd}'
            | '\u{070f}'
            | '\u{0890}'..='\u{0891}'
            | '\u{08e2}'
            | '\u{180e}'
            | '\u{200b}'..='\u{200f}'
            | '\u{2028}'..='\u{202e}'
            | '\u{2060}'..='\u{2064}'
            | '\u{2066}'..='\u{206f}'
            | '\u{feff}'
            | '\u{fff9}'..='\u{fffb}'
            | '\u{110bd}'
            | '\u{110cd}'
            | '\u{13430}'..='\u{1343f}'
            | '\u{1bca0}'..='\u{1bca3}'
            | '\u{1d173}'..='\u{1d17a}'
            | '\u{e0001}'
            | '\u{e0020}'..='\u{e007f}'
    )
}

fn check_name(name: &str) -> Result<(), SchemaError> {
    if !valid_name(name) {
        return Err(SchemaError::BadName(name.to_owned()));
    }
    Ok(())
}

impl Default for Schema {
    fn default() -> Schema {
        Schema::stream_edges()
    }
}

impl Schema {
    /// The four stream-edge events of [`Event`], all in the shared
    /// [`HOST_MONOTONIC`] domain; the producer event keeps its chunk sequence.
    pub fn stream_edges() -> Schema {
        Schema {
            events: Event::ALL
                .iter()
                .map(|e| EventSpec {
                    name: e.name().to_owned(),
                    domain: DomainId::HOST_MONOTONIC,
                    chunk_seq: *e == Event::ProducerFirstNonemptyEmit,
                })
                .collect(),
            domains: vec![HOST_MONOTONIC.to_owned()],
        }
    }

    /// A schema with no events yet and only the shared clock domain; add
    /// events with [`Schema::with_event`].
    pub fn empty() -> Schema {
        Schema {
            events: Vec::new(),
            domains: vec![HOST_MONOTONIC.to_owned()],
        }
    }

    /// Declares another clock domain, for values measured elsewhere
    /// ([`Recorder::record_elapsed`](crate::Recorder::record_elapsed)).
    /// Declaring a domain that exists is a no-op.
    pub fn with_domain(mut self, name: &str) -> Result<Schema, SchemaError> {
        check_name(name)?;
        if self.domains.iter().any(|d| d == name) {
            return Ok(self);
        }
        if self.domains.len() == MAX_DOMAINS {
            return Err(SchemaError::TooManyDomains);
        }
        self.domains.push(name.to_owned());
        Ok(self)
    }

    /// Declares an event recorded by default in `domain`; `keeps_chunk_seq`
    /// says whether its winning write keeps a chunk sequence number.
    pub fn with_event(
        mut self,
        name: &str,
        domain: &str,
        keeps_chunk_seq: bool,
    ) -> Result<Schema, SchemaError> {
        check_name(name)?;
        if self.events.iter().any(|e| e.name == name) {
            return Err(SchemaError::Duplicate(name.to_owned()));
        }
        if self.events.len() == MAX_EVENTS {
            return Err(SchemaError::TooManyEvents);
        }
        let domain = self
            .domain(domain)
            .ok_or_else(|| SchemaError::UnknownDomain(domain.to_owned()))?;
        self.events.push(EventSpec {
            name: name.to_owned(),
            domain,
            chunk_seq: keeps_chunk_seq,
        });
        Ok(self)
    }

    /// Builds a schema from decoded parts, checking every rule.
    pub(crate) fn from_parts(
        events: Vec<(String, u8, bool)>,
        domains: Vec<String>,
    ) -> Result<Schema, SchemaError> {
        if domains.first().map(String::as_str) != Some(HOST_MONOTONIC) {
            return Err(SchemaError::UnknownDomain(HOST_MONOTONIC.to_owned()));
        }
        let mut schema = Schema::empty();
        for d in &domains[1..] {
            check_name(d)?;
            if schema.domains.contains(d) {
                return Err(SchemaError::Duplicate(d.clone()));
            }
            schema = schema.with_domain(d)?;
        }
        if events.is_empty() {
            return Err(SchemaError::NoEvents);
        }
        for (name, domain, chunk) in events {
            let dname = schema
                .domains
                .get(domain as usize)
                .cloned()
                .ok_or_else(|| SchemaError::UnknownDomain(format!("#{domain}")))?;
            schema = schema.with_event(&name, &dname, chunk)?;
        }
        Ok(schema)
    }

    /// The events, in schema order.
    pub fn events(&self) -> &[EventSpec] {
        &self.events
    }

    /// The clock domains; index 0 is always [`HOST_MONOTONIC`].
    pub fn domains(&self) -> &[String] {
        &self.domains
    }

    /// The id of the event with this name.
    pub fn event(&self, name: &str) -> Option<EventId> {
        self.events
            .iter()
            .position(|e| e.name == name)
            .map(|i| EventId(i as u8))
    }

    /// The id of the clock domain with this name.
    pub fn domain(&self, name: &str) -> Option<DomainId> {
        self.domains
            .iter()
            .position(|d| d == name)
            .map(|i| DomainId(i as u8))
    }

    /// The name of a clock domain.
    pub fn domain_name(&self, id: DomainId) -> Option<&str> {
        self.domains.get(id.0 as usize).map(String::as_str)
    }

    pub(crate) fn validate(&self) -> Result<(), SchemaError> {
        if self.events.is_empty() {
            return Err(SchemaError::NoEvents);
        }
        Ok(())
    }
}
