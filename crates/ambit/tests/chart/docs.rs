//! The commands of a Markdown guide: every `helm`/`kubectl` line of its code blocks, split
//! into words as a shell would (continuations, quotes, comments).

/// One command of a guide.
#[derive(Clone, Debug, PartialEq)]
pub struct DocCommand {
    /// Its line in the guide (1-based).
    pub line: usize,
    /// Its words, starting with the program.
    pub words: Vec<String>,
}

/// The commands of `programs` in the fenced code blocks of `markdown`.
pub fn commands(markdown: &str, programs: &[&str]) -> Vec<DocCommand> {
    let mut out = Vec::new();
    let mut in_block = false;
    let mut pending: Option<(usize, String)> = None;
    for (i, line) in markdown.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            pending = None;
            continue;
        }
        if !in_block {
            continue;
        }
        let (start, mut text) = match pending.take() {
            Some((start, so_far)) => (start, format!("{so_far} {}", line.trim())),
            None => (i + 1, line.trim().trim_start_matches("$ ").to_owned()),
        };
        if let Some(rest) = text.strip_suffix('\\') {
            text = rest.trim_end().to_owned();
            pending = Some((start, text));
            continue;
        }
        let words = split(&text);
        if words.first().is_some_and(|w| programs.contains(&w.as_str())) {
            out.push(DocCommand { line: start, words });
        }
    }
    out
}

/// Shell words: whitespace-separated, single and double quotes, `#` comments.
fn split(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    let mut word: Option<String> = None;
    let mut quote: Option<char> = None;
    for ch in text.chars() {
        match (quote, ch) {
            (Some(q), c) if c == q => quote = None,
            (Some(_), c) => word.get_or_insert_with(String::new).push(c),
            (None, '\'' | '"') => {
                quote = Some(ch);
                word.get_or_insert_with(String::new);
            }
            (None, '#') if word.is_none() => break,
            (None, c) if c.is_whitespace() => words.extend(word.take()),
            (None, c) => word.get_or_insert_with(String::new).push(c),
        }
    }
    words.extend(word);
    words
}

#[test]
fn splits_like_a_shell() {
    let md = "text\n```sh\nhelm install ambit deploy/charts/ambit \\\n  -n istio-system   # a comment\nkubectl get 'pods' -A\necho no\n```\nhelm outside\n";
    let got = commands(md, &["helm", "kubectl"]);
    assert_eq!(
        got,
        [
            DocCommand {
                line: 3,
                words: ["helm", "install", "ambit", "deploy/charts/ambit", "-n", "istio-system"]
                    .map(String::from)
                    .to_vec()
            },
            DocCommand { line: 5, words: ["kubectl", "get", "pods", "-A"].map(String::from).to_vec() },
        ]
    );
}
