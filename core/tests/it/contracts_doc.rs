//! `docs/contracts.md` against the code: every declaration a ```rust block shows is
//! declared in the source files the block names, with the same kind and (for
//! functions) the same parameter names in the same order, and every repository path
//! the text names in backticks exists. A failure names the stale line of
//! contracts.md and what the code has.
//!
//! Each ```rust block starts with one or more comment lines naming its files
//! (`// kube/src/lib.rs kube/src/writer.rs`). A named `foo.rs` covers its module
//! directory `foo/**.rs` too; a named `mod.rs` covers the directory it is in.
//! Parameter types are not compared, so the doc may abbreviate them.

use std::collections::BTreeSet;
use std::fmt;
use std::path::{Path, PathBuf};

const DOC: &str = "docs/contracts.md";

/// The item kinds the check covers; `pub async fn` is a kind of its own, so a
/// function that became (or stopped being) async is stale too.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    Fn,
    AsyncFn,
    Struct,
    Enum,
    Trait,
    Type,
    Const,
}

impl fmt::Display for Kind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Kind::Fn => "pub fn",
            Kind::AsyncFn => "pub async fn",
            Kind::Struct => "pub struct",
            Kind::Enum => "pub enum",
            Kind::Trait => "pub trait",
            Kind::Type => "pub type",
            Kind::Const => "pub const",
        })
    }
}

/// One `pub` declaration found in doc or source text.
#[derive(Clone, Debug, PartialEq, Eq)]
struct Decl {
    kind: Kind,
    name: String,
    /// Parameter names in order (`self` receivers left out); functions only.
    params: Vec<String>,
    /// 1-based line of the text the declaration starts on.
    line: usize,
}

impl fmt::Display for Decl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}", self.kind, self.name)?;
        if matches!(self.kind, Kind::Fn | Kind::AsyncFn) {
            write!(f, "({})", self.params.join(", "))?;
        }
        Ok(())
    }
}

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("core/ has a parent: the repository root")
        .to_path_buf()
}

/// `text` with comments and string/char literals blanked to spaces (newlines kept,
/// so byte offsets and line numbers stay those of the original).
fn blank_comments_and_strings(text: &str) -> Vec<u8> {
    let b = text.as_bytes();
    let mut out = b.to_vec();
    let mut i = 0;
    let blank = |out: &mut Vec<u8>, from: usize, to: usize| {
        for c in &mut out[from..to] {
            if *c != b'\n' {
                *c = b' ';
            }
        }
    };
    while i < b.len() {
        if b[i..].starts_with(b"//") {
            let end = b[i..]
                .iter()
                .position(|&c| c == b'\n')
                .map_or(b.len(), |p| i + p);
            blank(&mut out, i, end);
            i = end;
        } else if b[i..].starts_with(b"/*") {
            // Rust block comments nest.
            let mut depth = 0usize;
            let mut j = i;
            while j < b.len() {
                if b[j..].starts_with(b"/*") {
                    depth += 1;
                    j += 2;
                } else if b[j..].starts_with(b"*/") {
                    depth -= 1;
                    j += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    j += 1;
                }
            }
            blank(&mut out, i, j);
            i = j;
        } else if b[i] == b'"' {
            // A raw string `r#"…"#` is not escaped; its prefix is left as an identifier.
            let hashes = b[..i].iter().rev().take_while(|&&c| c == b'#').count();
            let raw = i > hashes && b[i - hashes - 1] == b'r';
            let mut j = i + 1;
            while j < b.len() {
                if raw {
                    if b[j] == b'"' && b[j + 1..].iter().take(hashes).all(|&c| c == b'#') {
                        j += 1 + hashes;
                        break;
                    }
                } else if b[j] == b'\\' {
                    j += 1;
                } else if b[j] == b'"' {
                    j += 1;
                    break;
                }
                j += 1;
            }
            let j = j.min(b.len());
            blank(&mut out, i + 1, j.saturating_sub(1).max(i + 1));
            i = j;
        } else if b[i] == b'\''
            && (b.get(i + 2) == Some(&b'\'')
                || (b.get(i + 1) == Some(&b'\\') && b.get(i + 3) == Some(&b'\'')))
        {
            // A char literal ('x' or '\n'); a lifetime ('a) is left alone.
            let end = if b[i + 1] == b'\\' { i + 4 } else { i + 3 };
            blank(&mut out, i + 1, end - 1);
            i = end;
        } else {
            i += 1;
        }
    }
    out
}

fn is_ident_byte(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The identifier starting at `i` (after spaces), and the offset after it.
fn ident_at(b: &[u8], mut i: usize) -> Option<(String, usize)> {
    while i < b.len() && b[i].is_ascii_whitespace() {
        i += 1;
    }
    let start = i;
    while i < b.len() && is_ident_byte(b[i]) {
        i += 1;
    }
    (i > start).then(|| (String::from_utf8_lossy(&b[start..i]).into_owned(), i))
}

/// Parameter names of the parenthesised list opening at or after `i` (generics first).
fn fn_params(b: &[u8], mut i: usize) -> Option<Vec<String>> {
    // Skip generics `<…>` to the opening parenthesis.
    let mut angle = 0i32;
    while i < b.len() {
        match b[i] {
            b'<' => angle += 1,
            b'>' if b[i - 1] != b'-' => angle -= 1,
            b'(' if angle == 0 => break,
            b';' | b'{' => return None,
            _ => {}
        }
        i += 1;
    }
    let open = i;
    let mut depth = 0i32;
    let mut parts = Vec::new();
    let mut start = open + 1;
    while i < b.len() {
        match b[i] {
            b'(' | b'[' | b'{' => depth += 1,
            b'<' => depth += 1,
            b'>' if b[i - 1] != b'-' => depth -= 1,
            b')' | b']' | b'}' => {
                depth -= 1;
                if depth == 0 {
                    parts.push(&b[start..i]);
                    break;
                }
            }
            b',' if depth == 1 => {
                parts.push(&b[start..i]);
                start = i + 1;
            }
            _ => {}
        }
        i += 1;
    }
    if i >= b.len() {
        return None;
    }
    let mut names = Vec::new();
    for part in parts {
        let part = String::from_utf8_lossy(part);
        let part = part.trim();
        if part.is_empty() {
            continue;
        }
        let name = part.split(':').next().unwrap_or("").trim();
        let name = name.strip_prefix("mut ").unwrap_or(name).trim();
        if matches!(name, "self" | "&self" | "&mut self" | "mut self")
            || name.starts_with("&'") && name.ends_with("self")
        {
            continue;
        }
        names.push(name.to_string());
    }
    Some(names)
}

/// Every `pub` (not `pub(crate)`) fn/struct/enum/trait/type/const declared in `text`.
fn declarations(text: &str) -> Vec<Decl> {
    let b = blank_comments_and_strings(text);
    let mut out = Vec::new();
    let mut i = 0;
    while i + 3 <= b.len() {
        let word_start = i == 0 || !is_ident_byte(b[i - 1]);
        if !(word_start
            && b[i..].starts_with(b"pub")
            && b.get(i + 3).is_some_and(|c| c.is_ascii_whitespace()))
        {
            i += 1;
            continue;
        }
        let line = b[..i].iter().filter(|&&c| c == b'\n').count() + 1;
        let Some((mut word, mut j)) = ident_at(&b, i + 3) else {
            i += 3;
            continue;
        };
        let mut asyncness = false;
        // Qualifiers before `fn`.
        loop {
            match word.as_str() {
                "async" => asyncness = true,
                "const" | "unsafe" | "extern" => {
                    // `pub const NAME` is a constant; `pub const fn` a function.
                    if word == "const" {
                        let (next, _) = ident_at(&b, j).unwrap_or_default();
                        if next != "fn" && next != "unsafe" && next != "async" {
                            break;
                        }
                    }
                }
                _ => break,
            }
            match ident_at(&b, j) {
                Some((w, k)) => (word, j) = (w, k),
                None => break,
            }
        }
        let kind = match word.as_str() {
            "fn" if asyncness => Kind::AsyncFn,
            "fn" => Kind::Fn,
            "struct" => Kind::Struct,
            "enum" => Kind::Enum,
            "trait" => Kind::Trait,
            "type" => Kind::Type,
            "const" => Kind::Const,
            _ => {
                i = j;
                continue;
            }
        };
        let Some((name, k)) = ident_at(&b, j) else {
            i = j;
            continue;
        };
        let params = if matches!(kind, Kind::Fn | Kind::AsyncFn) {
            fn_params(&b, k).unwrap_or_default()
        } else {
            Vec::new()
        };
        out.push(Decl {
            kind,
            name,
            params,
            line,
        });
        i = k;
    }
    out
}

/// One ```rust block of the doc: the files its leading comment lines name, its
/// text, and the doc line its text starts on.
struct Block {
    open_line: usize,
    files: Vec<String>,
    text: String,
    first_line: usize,
}

fn rust_blocks(doc: &str) -> Vec<Block> {
    let mut blocks = Vec::new();
    let mut lines = doc.lines().enumerate();
    while let Some((n, line)) = lines.next() {
        if line.trim() != "```rust" {
            continue;
        }
        let mut body = Vec::new();
        for (_, l) in lines.by_ref() {
            if l.trim() == "```" {
                break;
            }
            body.push(l);
        }
        let mut files = Vec::new();
        let mut skip = 0;
        for l in &body {
            let Some(rest) = l.trim().strip_prefix("// ") else {
                break;
            };
            let tokens: Vec<&str> = rest.split_whitespace().collect();
            if tokens.is_empty() || !tokens.iter().all(|t| t.ends_with(".rs")) {
                break;
            }
            files.extend(tokens.iter().map(|t| t.to_string()));
            skip += 1;
        }
        let mut text = String::new();
        for _ in 0..skip {
            // Keep line numbering: the file lines become empty lines.
            text.push('\n');
        }
        for l in &body[skip..] {
            text.push_str(l);
            text.push('\n');
        }
        blocks.push(Block {
            open_line: n + 1,
            files,
            text,
            first_line: n + 2,
        });
    }
    blocks
}

fn rs_files_under(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let p = e.path();
        if p.is_dir() {
            rs_files_under(&p, out);
        } else if p.extension().is_some_and(|x| x == "rs") {
            out.push(p);
        }
    }
}

/// A named file and its module directory (`foo.rs` → `foo/**.rs`; `mod.rs` → its
/// directory).
fn module_files(root: &Path, file: &str) -> Vec<PathBuf> {
    let path = root.join(file);
    let mut out = Vec::new();
    if path.file_name().is_some_and(|n| n == "mod.rs") {
        rs_files_under(path.parent().expect("mod.rs has a directory"), &mut out);
    } else {
        out.push(path.clone());
        rs_files_under(&path.with_extension(""), &mut out);
    }
    out.sort();
    out.dedup();
    out
}

/// Expands `{a,b}` alternatives (one level, any number of groups).
fn expand_braces(s: &str) -> Vec<String> {
    let (Some(open), Some(close)) = (s.find('{'), s.find('}')) else {
        return vec![s.to_string()];
    };
    if close < open {
        return vec![s.to_string()];
    }
    s[open + 1..close]
        .split(',')
        .flat_map(|alt| expand_braces(&format!("{}{}{}", &s[..open], alt, &s[close + 1..])))
        .collect()
}

/// Whether a repository path (possibly with `*`/`**` globs) names something that exists.
fn path_exists(root: &Path, path: &str) -> bool {
    let path = path.trim_end_matches('/');
    if let Some(prefix) = path.strip_suffix("/**") {
        return root.join(prefix).is_dir();
    }
    if !path.contains('*') {
        return root.join(path).exists();
    }
    // One `*` in the last component: some entry of its directory matches.
    let (dir, pattern) = path.rsplit_once('/').unwrap_or(("", path));
    if dir.contains('*') || pattern.matches('*').count() > 1 {
        return false;
    }
    let (pre, post) = pattern
        .split_once('*')
        .expect("the component holds the star");
    std::fs::read_dir(root.join(dir)).is_ok_and(|entries| {
        entries.flatten().any(|e| {
            let n = e.file_name();
            let n = n.to_string_lossy();
            n.len() >= pre.len() + post.len() && n.starts_with(pre) && n.ends_with(post)
        })
    })
}

/// Backticked spans that look like repository paths: a path whose first component is
/// an entry at the repository root, or anything ending in `.rs`.
fn repo_paths(root: &Path, doc: &str) -> Vec<(usize, String)> {
    let top: BTreeSet<String> = std::fs::read_dir(root)
        .expect("repository root is readable")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    let mut out = Vec::new();
    let mut in_block = false;
    for (n, line) in doc.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_block = !in_block;
            continue;
        }
        let spans: Vec<&str> = if in_block {
            // In code, a path is only named in comments, e.g. `// core/src/engine.rs`.
            line.split_once("//")
                .map(|(_, c)| c.split_whitespace().collect())
                .unwrap_or_default()
        } else {
            line.split('`').skip(1).step_by(2).collect()
        };
        for span in spans {
            let span = span.trim_matches(|c: char| matches!(c, ',' | ';' | '(' | ')' | ':'));
            if span.is_empty() || span.contains(char::is_whitespace) || !span.contains('/') {
                continue;
            }
            if span.starts_with('/') || span.starts_with('.') || span.contains("::") {
                continue;
            }
            let first = span.split('/').next().unwrap_or("");
            if top.contains(first) || span.ends_with(".rs") {
                out.push((n + 1, span.to_string()));
            }
        }
    }
    out
}

/// The declarations of the source files `block` names (and their
/// submodules), each with its file.
fn declared_in(root: &Path, block: &Block, stale: &mut Vec<String>) -> Vec<(PathBuf, Decl)> {
    let mut files = Vec::new();
    for f in &block.files {
        if !root.join(f).is_file() {
            stale.push(format!("{DOC}:{}: `{f}` does not exist", block.open_line));
        }
        files.extend(module_files(root, f));
    }
    let mut source = Vec::new();
    for f in &files {
        let text = std::fs::read_to_string(f)
            .unwrap_or_else(|e| panic!("{} unreadable: {e}", f.display()));
        source.extend(declarations(&text).into_iter().map(|d| (f.clone(), d)));
    }
    source
}

/// What the code has instead of the declaration `d` of a block: the
/// declarations of that name in `source`, or that there is none.
fn code_has(root: &Path, d: &Decl, source: &[(PathBuf, Decl)]) -> String {
    let same_name: Vec<&(PathBuf, Decl)> =
        source.iter().filter(|(_, s)| s.name == d.name).collect();
    if same_name.is_empty() {
        return format!("nothing named `{}`", d.name);
    }
    same_name
        .iter()
        .map(|(f, s)| {
            format!(
                "`{s}` ({}:{})",
                f.strip_prefix(root).unwrap_or(f).display(),
                s.line
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Checks every declaration `block` shows against the files it names,
/// adding a line to `stale` for each that differs; how many it checked.
fn check_block(root: &Path, block: &Block, stale: &mut Vec<String>) -> usize {
    if block.files.is_empty() {
        stale.push(format!(
            "{DOC}:{}: the ```rust block names no source file (start it with `// path/to/file.rs`)",
            block.open_line
        ));
        return 0;
    }
    let source = declared_in(root, block, stale);
    let shown = declarations(&block.text);
    assert!(
        !shown.is_empty(),
        "{DOC}:{}: a ```rust block that declares nothing pub",
        block.open_line
    );
    for d in &shown {
        let line = block.first_line + d.line - 1;
        if source
            .iter()
            .any(|(_, s)| s.name == d.name && s.kind == d.kind && s.params == d.params)
        {
            continue;
        }
        stale.push(format!(
            "{DOC}:{line}: `{d}` is stale; in {} the code has {}",
            block.files.join(" "),
            code_has(root, d, &source)
        ));
    }
    shown.len()
}

#[test]
fn contracts_doc_declarations_match_the_code() {
    let root = repo_root();
    let doc = std::fs::read_to_string(root.join(DOC)).expect("docs/contracts.md is readable");
    let blocks = rust_blocks(&doc);
    assert!(
        blocks.len() >= 5,
        "{DOC}: expected its ```rust blocks, found {}",
        blocks.len()
    );
    let mut stale = Vec::new();
    let checked: usize = blocks
        .iter()
        .map(|block| check_block(&root, block, &mut stale))
        .sum();
    for (line, path) in repo_paths(&root, &doc) {
        if !expand_braces(&path).iter().all(|p| path_exists(&root, p)) {
            stale.push(format!(
                "{DOC}:{line}: `{path}` does not exist in the repository"
            ));
        }
    }
    assert!(
        stale.is_empty(),
        "{DOC} has drifted from the code ({} problems):\n{}",
        stale.len(),
        stale.join("\n")
    );
    assert!(
        checked >= 20,
        "only {checked} declarations checked: the block parser lost them"
    );
}

#[test]
fn declaration_parser_reads_names_kinds_and_parameters() {
    let src = "/// `pub fn not_me()` in a doc comment\n\
               pub(crate) fn private(a: u8) {}\n\
               pub async fn start(settings: S, client: &Client<'_>,\n    f: Box<dyn Fn(u8, u8) -> bool>) -> R {}\n\
               impl X { pub fn get(&self, key: &str /* a, b */) -> Option<&[u8]>; }\n\
               pub const fn c<T: Into<u8>>(mut t: T) -> u8 { 0 }\n\
               pub const N: [&str; 2] = [\"pub fn in_string()\", \"b\"];\n\
               pub struct S<'a> { pub f: &'a str }\n";
    let got: Vec<String> = declarations(src)
        .iter()
        .map(|d| format!("{}@{}", d, d.line))
        .collect();
    assert_eq!(
        got,
        [
            "pub async fn start(settings, client, f)@3",
            "pub fn get(key)@5",
            "pub fn c(t)@6",
            "pub const N@7",
            "pub struct S@8",
        ]
    );
    assert_eq!(
        expand_braces("collector/src/{main,run}.rs"),
        ["collector/src/main.rs", "collector/src/run.rs"]
    );
}
