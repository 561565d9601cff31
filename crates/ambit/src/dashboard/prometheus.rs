//! The proxies' and waypoints' counters from a Prometheus that scrapes them (the common install
//! in a cluster): one instant query per metric, through its HTTP API (`/api/v1/query`).

use std::collections::BTreeMap;
use std::net::SocketAddr;

use serde_json::Value;

use super::collect::{Family, MAX_SERIES, Series, Snapshot};

/// The families the graph is drawn from.
const FAMILIES: [Family; 5] =
    [Family::Opened, Family::Failed, Family::Sent, Family::Received, Family::Requests];

/// Adds every series of the families to `s`; what cannot be read goes to `s.problems`.
pub fn read(s: &mut Snapshot, prometheus: SocketAddr) {
    for f in FAMILIES {
        let path = format!("/api/v1/query?query={}", f.metric());
        let answer = match ambit_cluster::probe::request(None, prometheus, "GET", &path) {
            Ok((200, body)) => body,
            Ok((code, body)) => {
                s.problems.push(format!(
                    "Prometheus: {path} answered {code}: {}",
                    ambit_admin::clip(body.trim(), 200)
                ));
                continue;
            }
            Err(e) => {
                s.problems.push(format!("Prometheus {prometheus}: {e}"));
                return;
            }
        };
        match series(f, &answer) {
            Ok(list) => s.series.extend(list),
            Err(e) => s.problems.push(format!("Prometheus: {path}: {e}")),
        }
    }
}

/// The series of one query's answer (`{"status":"success","data":{"resultType":"vector",…}}`).
fn series(family: Family, body: &str) -> Result<Vec<Series>, String> {
    let v: Value = serde_json::from_str(body).map_err(|e| format!("the answer is not JSON: {e}"))?;
    if v["status"] != "success" {
        return Err(format!("the query failed: {}", v["error"].as_str().unwrap_or("no reason given")));
    }
    let result = v["data"]["result"].as_array().ok_or("the answer has no data.result list")?;
    if result.len() > MAX_SERIES {
        return Err(format!("{} series, more than the {MAX_SERIES} read", result.len()));
    }
    Ok(result
        .iter()
        .filter_map(|r| {
            let labels: BTreeMap<String, String> = r["metric"]
                .as_object()?
                .iter()
                .filter_map(|(k, v)| Some((k.clone(), v.as_str()?.to_owned())))
                .collect();
            let value: f64 = r["value"][1].as_str()?.parse().ok()?;
            value.is_finite().then_some(Series { family, labels, value })
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_instant_query_s_answer_reads_into_series() {
        let body = r#"{"status":"success","data":{"resultType":"vector","result":[
            {"metric":{"__name__":"istio_tcp_connections_opened_total","reporter":"destination","pod":"ztunnel-x"},"value":[1.7e9,"12"]},
            {"metric":{"reporter":"source"},"value":[1.7e9,"NaN"]}]}}"#;
        let s = series(Family::Opened, body).expect("reads");
        assert_eq!(s.len(), 1, "NaN is left out");
        assert_eq!(s[0].label("reporter"), "destination");
        assert_eq!(s[0].value, 12.0);
        assert_eq!(
            series(Family::Opened, r#"{"status":"error","error":"parse error at char 3"}"#),
            Err("the query failed: parse error at char 3".to_owned())
        );
        assert_eq!(
            series(Family::Opened, "<html>"),
            Err("the answer is not JSON: expected value at line 1 column 1".to_owned())
        );
    }
}
