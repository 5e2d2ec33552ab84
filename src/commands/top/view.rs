//! Drawing one [`Screen`] with ratatui: a header of daemon-wide figures, a table of targets.

use ratatui::layout::{Constraint, Layout};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Cell, Paragraph, Row, Table};
use ratatui::Frame;

use super::model::{PodRates, Routing, Totals};
use kvindex::api::WriterStatus;
use kvindex::ingest::PodStatus;

/// Whether the daemon answered the last poll.
#[derive(Debug, Clone, PartialEq)]
pub enum Reach {
    /// Not polled yet.
    Starting,
    /// `/metrics` answered.
    Up,
    /// `/metrics` did not answer: the error, and for how many seconds it has not.
    Gone {
        /// Why the last poll failed.
        error: String,
        /// Seconds since the last good poll (or since `top` started).
        for_seconds: f64,
    },
}

/// Daemon-wide rates between two polls.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct TotalRates {
    /// Messages per second.
    pub messages: f64,
    /// Events per second.
    pub events: f64,
    /// API requests per second.
    pub api_requests: f64,
    /// Redis commands per second.
    pub mirror_writes: f64,
}

/// Everything one frame shows.
#[derive(Debug, Clone, PartialEq)]
pub struct Screen {
    /// The metrics URL polled.
    pub url: String,
    /// The API URL polled.
    pub api_url: String,
    /// Seconds between polls.
    pub interval: f64,
    /// Whether the daemon answers.
    pub reach: Reach,
    /// The last figures read (kept while the daemon is gone).
    pub totals: Option<Totals>,
    /// Their rates.
    pub rates: TotalRates,
    /// The targets, or why `/v1/pods` could not be read.
    pub pods: Result<Vec<(PodStatus, PodRates)>, String>,
    /// With `ha:`: which replica writes Redis.
    pub writer: Option<WriterStatus>,
}

/// Draws the whole screen.
pub fn draw(frame: &mut Frame, screen: &Screen) {
    let errors = errors(screen);
    let error_height = if errors.is_empty() {
        0
    } else {
        errors.len() as u16 + 2
    };
    // Six lines and the borders, and the writer's line with `ha:`.
    let head_height = 8 + u16::from(screen.writer.is_some());
    let [head, body, errs, foot] = Layout::vertical([
        Constraint::Length(head_height),
        Constraint::Min(3),
        Constraint::Length(error_height.min(10)),
        Constraint::Length(1),
    ])
    .areas(frame.area());
    frame.render_widget(header(screen), head);
    frame.render_widget(targets(screen), body);
    if !errors.is_empty() {
        frame.render_widget(
            Paragraph::new(errors)
                .style(Style::default().fg(Color::Red))
                .block(
                    Block::default()
                        .borders(Borders::ALL)
                        .title(" connect errors "),
                ),
            errs,
        );
    }
    frame.render_widget(
        Paragraph::new("q quits · rates are per second between two polls · per-target figures from /v1/pods, totals from /metrics"),
        foot,
    );
}

fn header(screen: &Screen) -> Paragraph<'static> {
    let bold = Style::default().add_modifier(Modifier::BOLD);
    let (state, style) = match &screen.reach {
        Reach::Starting => ("connecting…".to_owned(), Style::default()),
        Reach::Up => ("up".to_owned(), Style::default().fg(Color::Green)),
        Reach::Gone { error, for_seconds } => (
            format!("UNREACHABLE for {for_seconds:.0} s ({error}); showing the last figures"),
            Style::default().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
    };
    let mut lines = vec![Line::from(vec![
        Span::styled("daemon ", bold),
        Span::styled(state, style),
        Span::raw(format!("   every {:.1} s", screen.interval)),
    ])];
    if let Some(t) = &screen.totals {
        let r = &screen.rates;
        lines.push(Line::from(format!(
            "ingest   {:.1} msg/s   {:.1} events/s   decode errors {}   gaps {}   replays {} ok / {} failed   resets {}   restarts {}",
            r.messages,
            r.events,
            count(t.decode_errors),
            count(t.seq_gaps),
            count(t.replays_succeeded),
            count(t.replays_failed),
            count(t.source_resets),
            count(t.restarts)
        )));
        let resident: Vec<String> = t
            .resident
            .iter()
            .map(|(m, n)| format!("{m} {}", count(*n)))
            .collect();
        lines.push(Line::from(format!(
            "resident {}",
            if resident.is_empty() {
                "none yet (refreshed every 5 s)".to_owned()
            } else {
                resident.join("   ")
            }
        )));
        lines.push(Line::from(match &t.mirror {
            None => "mirror   off (in-memory index only)".to_owned(),
            Some(m) => format!(
                "mirror   queue {:.0}   {:.0} writes/s   flush p99 {:.1} ms   dirty {}   reconciling {}",
                m.queue_depth,
                r.mirror_writes,
                m.flush_p99_seconds * 1e3,
                if m.dirty { "YES" } else { "no" },
                if m.reconciling { "yes" } else { "no" }
            ),
        }));
        if let Some(w) = &screen.writer {
            lines.push(Line::from(writer_line(w)));
        }
        lines.push(Line::from(format!(
            "api      {:.1} req/s   {} answered",
            r.api_requests,
            count(t.api_requests)
        )));
        lines.push(Line::from(routing_line(&t.routing)));
    }
    Paragraph::new(lines).block(Block::default().borders(Borders::ALL).title(format!(
        " kvindex top · {} · api {} ",
        screen.url, screen.api_url
    )))
}

/// Who writes Redis: this replica, or the lease holder while this one stands by.
fn writer_line(w: &WriterStatus) -> String {
    let holder = w.holder.as_deref().unwrap_or("nobody");
    if w.role == "leader" {
        format!("writer   this replica (HA leader, lease {holder})")
    } else {
        let ready = if w.ready_to_lead {
            "ready to lead"
        } else {
            "catching up"
        };
        format!("writer   {holder} (this replica: HA standby, {ready})")
    }
}

/// Predictions judged by routers' feedback, and the speculative placements live.
fn routing_line(g: &Routing) -> String {
    let predictions = match g.exact_percent() {
        None => "no feedback yet".to_owned(),
        Some(exact) => format!(
            "{} exact / {} over / {} under ({exact:.1} % exact)",
            count(g.exact),
            count(g.over),
            count(g.under)
        ),
    };
    format!(
        "routing  predictions {predictions}   unknown feedback {}   speculative {} live ({} confirmed, {} expired, {} dropped)",
        count(g.unknown_feedback),
        count(g.speculative_live),
        count(g.confirmed),
        count(g.expired),
        count(g.dropped)
    )
}

/// A counter or gauge read as a float, shown as a whole number (never `-0`).
fn count(x: f64) -> u64 {
    if x.is_finite() && x > 0.0 {
        x.round() as u64
    } else {
        0
    }
}

const COLUMNS: [&str; 12] = [
    "TARGET",
    "ENGINE",
    "STATE",
    "RANKS",
    "EVENTS/S",
    "STORED/S",
    "REMOVED/S",
    "RESIDENT",
    "LAST MSG",
    "GAPS",
    "REPLAYS",
    "RESETS/RESTARTS",
];

fn targets(screen: &Screen) -> Table<'static> {
    let header =
        Row::new(COLUMNS.map(Cell::from)).style(Style::default().add_modifier(Modifier::BOLD));
    let rows: Vec<Row> = match &screen.pods {
        Err(why) => vec![Row::new(vec![Cell::from(format!("/v1/pods: {why}"))])],
        Ok(pods) => pods.iter().map(|(p, r)| pod_row(p, r)).collect(),
    };
    let widths = [
        Constraint::Min(16),
        Constraint::Length(7),
        Constraint::Length(12),
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Length(9),
        Constraint::Min(20),
        Constraint::Length(9),
        Constraint::Length(5),
        Constraint::Length(9),
        Constraint::Length(15),
    ];
    Table::new(rows, widths)
        .header(header)
        .block(Block::default().borders(Borders::ALL).title(" targets "))
}

/// One line per target whose ranks cannot connect, with the reason.
fn errors(screen: &Screen) -> Vec<Line<'static>> {
    let Ok(pods) = &screen.pods else {
        return Vec::new();
    };
    pods.iter()
        .filter_map(|(p, _)| Some(Line::from(format!("{}: {}", p.pod, p.last_error.as_ref()?))))
        .collect()
}

fn pod_row(p: &PodStatus, r: &PodRates) -> Row<'static> {
    let state_style = match p.state.as_str() {
        "connected" => Style::default().fg(Color::Green),
        _ => Style::default().fg(Color::Yellow),
    };
    let resident: Vec<String> = p
        .resident_blocks
        .iter()
        .map(|(m, n)| format!("{m} {n}"))
        .collect();
    let c = &p.counters;
    Row::new(vec![
        Cell::from(p.pod.clone()),
        Cell::from(p.engine.clone()),
        Cell::from(p.state.clone()).style(state_style),
        Cell::from(format!("{}/{}", p.ranks_connected, p.dp_ranks)),
        Cell::from(format!("{:.1}", r.events)),
        Cell::from(format!("{:.1}", r.blocks_stored)),
        Cell::from(format!("{:.1}", r.blocks_removed)),
        Cell::from(if resident.is_empty() {
            "-".to_owned()
        } else {
            resident.join(" ")
        }),
        Cell::from(
            p.last_message_age_seconds
                .map_or("never".to_owned(), |a| format!("{a:.1} s")),
        ),
        Cell::from(c.seq_gaps.to_string()),
        Cell::from(format!(
            "{}/{}",
            c.replays_succeeded,
            c.replays_succeeded + c.replays_failed
        )),
        Cell::from(format!("{}/{}", c.source_resets, c.restarts)),
    ])
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::Terminal;

    use super::*;

    fn shown(screen: &Screen) -> String {
        let mut terminal = Terminal::new(TestBackend::new(180, 24)).unwrap();
        terminal.draw(|f| draw(f, screen)).unwrap();
        let buffer = terminal.backend().buffer();
        let width = buffer.area.width as usize;
        let cells: Vec<&str> = buffer.content.iter().map(|c| c.symbol()).collect();
        cells.chunks(width).map(|row| row.concat() + "\n").collect()
    }

    fn screen(routing: Routing) -> Screen {
        Screen {
            url: "http://127.0.0.1:9090".into(),
            api_url: "http://127.0.0.1:8080".into(),
            interval: 1.0,
            reach: Reach::Up,
            totals: Some(Totals {
                routing,
                ..Totals::default()
            }),
            rates: TotalRates::default(),
            pods: Ok(Vec::new()),
            writer: None,
        }
    }

    #[test]
    fn the_routing_line_shows_predictions_and_live_placements() {
        let text = shown(&screen(Routing::default()));
        assert!(
            text.contains(
                "routing  predictions no feedback yet   unknown feedback 0   speculative 0 live"
            ),
            "{text}"
        );
        let routing = Routing {
            exact: 6.0,
            over: 1.0,
            under: 1.0,
            unknown_feedback: 2.0,
            speculative_live: 40.0,
            confirmed: 30.0,
            expired: 15.0,
            dropped: 5.0,
        };
        let text = shown(&screen(routing));
        assert!(
            text.contains("predictions 6 exact / 1 over / 1 under (75.0 % exact)   unknown feedback 2   speculative 40 live (30 confirmed, 15 expired, 5 dropped)"),
            "{text}"
        );
        assert!(
            text.contains(" targets "),
            "the table keeps its place: {text}"
        );
    }

    #[test]
    fn the_writer_line_names_this_replica_or_the_lease_holder() {
        let leader = WriterStatus {
            role: "leader".to_owned(),
            holder: Some("kvindex-0/7".to_owned()),
            ready_to_lead: true,
            ..WriterStatus::default()
        };
        assert!(writer_line(&leader).contains("this replica (HA leader"));
        let standby = WriterStatus {
            role: "standby".to_owned(),
            ..leader
        };
        let line = writer_line(&standby);
        assert!(
            line.contains("kvindex-0/7 (this replica: HA standby, ready to lead)"),
            "{line}"
        );
        // The header grows by the writer's line: the routing line stays in view.
        let mut with_writer = screen(Routing::default());
        with_writer.writer = Some(standby);
        let text = shown(&with_writer);
        assert!(text.contains("writer   kvindex-0/7"), "{text}");
        assert!(text.contains("routing  predictions"), "{text}");
    }
}
