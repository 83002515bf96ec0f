//! The claim plan of a worker's handlers: which names draw together, the
//! capacities each draw spends, and the fleet limit each claims under.

use std::collections::HashMap;
use std::sync::Arc;

use waymark_store::{ClaimRequest, Error, FleetLimit};

use super::limits::Capacities;
use super::plan::{Planner, Source};
use crate::shared::HandlerOptions;

/// The claim plan of these handlers (each name with its batch size and
/// options): one shared draw for the names
/// without limits or batches, one draw for each of the others, each with
/// the capacities it spends; each draw split by the fleet limit its tasks
/// fall under (a draw of the queues and names under one limit, and one of
/// those under none).
pub(crate) fn plan(
    handlers: &[(&String, usize, &HandlerOptions)],
    resources: &HashMap<String, usize>,
    fleet: &[FleetLimit],
    queues: &[String],
    base: ClaimRequest,
) -> Result<Planner, Error> {
    let (caps, index) = Capacities::new(resources);
    let mut handlers = handlers.to_vec();
    handlers.sort_by_key(|(name, ..)| *name);
    let (mut shared, mut sources) = (Vec::new(), Vec::new());
    for (name, batch, options) in handlers {
        let mut limits = Vec::new();
        if let Some(r) = &options.resource {
            limits.push(index[r]);
        }
        if let Some(n) = options.max_running {
            limits.push(caps.add(format!("handler {name:?}"), n));
        }
        if limits.is_empty() && batch == 1 {
            shared.push(name.clone());
        } else {
            sources.push(Source::new(vec![name.clone()], batch, limits.into()));
        }
    }
    if !shared.is_empty() {
        sources.insert(0, Source::new(shared, 1, Arc::from(Vec::new())));
    }
    let mut split = Vec::with_capacity(sources.len());
    let mut used = vec![false; fleet.len()];
    for source in sources {
        split.extend(split_by_fleet_limits(source, fleet, queues, &mut used)?);
    }
    if let Some(unused) = used.iter().position(|u| !u) {
        return Err(Error::InvalidArgument(format!(
            "fleet limit {} covers none of this worker's queues and handlers",
            fleet[unused]
        )));
    }
    Ok(Planner::new(split, Arc::new(caps), base))
}

/// Splits one draw so that each part claims the tasks of one fleet limit,
/// or of none: per queue, its names by the limit that covers them; parts
/// with the same limit and names share one draw over their queues.
fn split_by_fleet_limits(
    source: Source,
    fleet: &[FleetLimit],
    queues: &[String],
    used: &mut [bool],
) -> Result<Vec<Source>, Error> {
    if fleet.is_empty() {
        return Ok(vec![source]);
    }
    let mut parts: std::collections::BTreeMap<(Option<usize>, Vec<String>), Vec<String>> = Default::default();
    for queue in queues {
        let mut by_limit: std::collections::BTreeMap<Option<usize>, Vec<String>> = Default::default();
        for name in &source.names {
            let mut covering =
                fleet.iter().enumerate().filter(|(_, l)| l.covers(queue, name)).map(|(i, _)| i);
            let first = covering.next();
            if let (Some(a), Some(b)) = (first, covering.next()) {
                return Err(Error::InvalidArgument(format!(
                    "tasks named {name:?} in queue {queue:?} fall under two fleet limits ({} and {}); give each task one",
                    fleet[a], fleet[b]
                )));
            }
            if let Some(i) = first {
                used[i] = true;
            }
            by_limit.entry(first).or_default().push(name.clone());
        }
        for (limit, names) in by_limit {
            parts.entry((limit, names)).or_default().push(queue.clone());
        }
    }
    Ok(parts
        .into_iter()
        .map(|((limit, names), part_queues)| Source {
            queues: (part_queues != queues).then_some(part_queues),
            fleet: limit.map(|i| fleet[i].clone()),
            ..Source::new(names, source.batch, source.limits.clone())
        })
        .collect())
}
