//! The metrics endpoint from outside: raw HTTP over a real TCP socket, and the answer
//! parsed by a real Prometheus text parser (the Python client's, Debian's
//! `python3-prometheus-client`), never by the code under test.

use super::*;

/// One HTTP exchange: `request` sent as is, everything until the server closes read back.
/// (status code, head, body).
pub fn http(addr: &str, request: &[u8], timeout: Duration) -> (u16, String, Vec<u8>) {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(timeout)).unwrap();
    // The server may answer and close before it has read all of a huge request.
    let _ = s.write_all(request);
    let mut answer = Vec::new();
    if let Err(e) = s.read_to_end(&mut answer) {
        // A reset after the answer was read is fine (a request the server did not read
        // whole); none at all is not.
        assert!(!answer.is_empty(), "reading the answer from {addr}: {e}");
    }
    let text = String::from_utf8_lossy(&answer);
    let head_end = text
        .find("\r\n\r\n")
        .unwrap_or_else(|| panic!("no HTTP head in {text:?}"));
    let head = text[..head_end].to_string();
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or_else(|| panic!("no status in {head:?}"));
    (status, head, answer[head_end + 4..].to_vec())
}

/// `GET /metrics`: the body, after checking the status and content type.
#[track_caller]
pub fn scrape(addr: &str) -> String {
    let (status, head, body) = http(
        addr,
        b"GET /metrics HTTP/1.1\r\nHost: tandem\r\nAccept: text/plain\r\n\r\n",
        Duration::from_secs(20),
    );
    assert_eq!(status, 200, "{head}");
    assert!(
        head.contains("Content-Type: text/plain; version=0.0.4"),
        "{head}"
    );
    String::from_utf8(body).expect("metrics are UTF-8")
}

/// A Python with `prometheus_client`: Debian's (/usr/bin/python3) first, as another one on
/// PATH (pyenv) may not see Debian's packages. Records a skip if there is none.
pub fn prometheus_python(test: &str) -> Option<PathBuf> {
    let candidates = [PathBuf::from("/usr/bin/python3")]
        .into_iter()
        .chain(find_tool("python3"));
    for py in candidates {
        let ok = Command::new(&py)
            .args(["-c", "import prometheus_client.parser"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .is_ok_and(|s| s.success());
        if ok {
            return Some(py);
        }
    }
    skip(
        test,
        "no python3 with prometheus_client (Debian package python3-prometheus-client; scripts/test installs it)",
    );
    None
}

/// What the parser made of a scrape.
pub struct Parsed {
    /// Family name → type.
    pub families: HashMap<String, String>,
    /// (sample name, labels, value).
    pub samples: Vec<(String, HashMap<String, String>, f64)>,
}

impl Parsed {
    /// The samples named `name` whose labels include `labels`.
    pub fn find(&self, name: &str, labels: &[(&str, &str)]) -> Vec<f64> {
        self.samples
            .iter()
            .filter(|(n, l, _)| {
                n == name
                    && labels
                        .iter()
                        .all(|(k, v)| l.get(*k).map(String::as_str) == Some(*v))
            })
            .map(|(_, _, v)| *v)
            .collect()
    }

    /// The one sample named `name` with `labels`; panics unless there is exactly one.
    #[track_caller]
    pub fn value(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        match self.find(name, labels)[..] {
            [v] => v,
            ref all => panic!("{} samples {name}{labels:?}: {all:?}", all.len()),
        }
    }
}

const PARSER: &str = r#"
import json, sys
from prometheus_client.parser import text_string_to_metric_families
families, samples = {}, []
for f in text_string_to_metric_families(sys.stdin.read()):
    families[f.name] = f.type
    for s in f.samples:
        samples.append([s.name, s.labels, s.value])
json.dump({"families": families, "samples": samples}, sys.stdout)
"#;

/// Parses `text` with the Prometheus client's parser; panics with its error if it fails.
#[track_caller]
pub fn parse_metrics(python: &Path, text: &str) -> Parsed {
    let mut child = Command::new(python)
        .args(["-c", PARSER])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("python3 starts");
    let mut stdin = child.stdin.take().unwrap();
    let input = text.to_string();
    let writer = thread::spawn(move || {
        let _ = stdin.write_all(input.as_bytes());
    });
    let out = child.wait_with_output().expect("python3 runs");
    writer.join().unwrap();
    assert!(
        out.status.success(),
        "the Prometheus parser rejects the metrics: {}\n--- the text (first 4000 bytes) ---\n{}",
        String::from_utf8_lossy(&out.stderr),
        &text[..text.len().min(4000)]
    );
    let v: Json = serde_json::from_slice(&out.stdout).expect("the parser's JSON");
    let families = v["families"]
        .as_object()
        .unwrap()
        .iter()
        .map(|(k, t)| (k.clone(), t.as_str().unwrap().to_string()))
        .collect();
    let samples = v["samples"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| {
            let labels = s[1]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_string()))
                .collect();
            let value = s[2].as_f64().unwrap_or(f64::NAN);
            (s[0].as_str().unwrap().to_string(), labels, value)
        })
        .collect();
    Parsed { families, samples }
}
