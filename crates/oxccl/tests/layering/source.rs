//! Reading Rust sources without a parser: enough of the token stream to find every module
//! path a file names (`use` trees, `crate::`/`super::`/`self::` paths in code), the modules
//! it declares and the items it defines. Comments and literals are blanked first, and every
//! item under `#[cfg(test)]` or `#[cfg(doc)]` is dropped: neither is code of its layer.

/// The code of a file: comments, string and char literals blanked (newlines kept, so line
/// numbers still hold), and every item under `#[cfg(test)]` or `#[cfg(doc)]` removed.
pub fn code_of(text: &str) -> String {
    remove_test_items(&blank_comments_and_literals(text))
}

fn is_ident_char(c: char) -> bool {
    c.is_alphanumeric() || c == '_'
}

/// Comments and string/char literals replaced: a literal by `""` or `' '`, a comment by
/// nothing, newlines kept.
fn blank_comments_and_literals(text: &str) -> String {
    let b: Vec<char> = text.chars().collect();
    let at = |i: usize| b.get(i).copied();
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    // Pushes the newlines of b[from..to], so that lines keep their numbers.
    let newlines = |out: &mut String, from: usize, to: usize| {
        let to = to.min(b.len());
        out.extend(b[from.min(to)..to].iter().filter(|c| **c == '\n'));
    };
    while i < b.len() {
        let c = b[i];
        let prev_ident = i > 0 && is_ident_char(b[i - 1]);
        if c == '/' && at(i + 1) == Some('/') {
            while i < b.len() && b[i] != '\n' {
                i += 1;
            }
        } else if c == '/' && at(i + 1) == Some('*') {
            let (start, mut depth) = (i, 0usize);
            while i < b.len() {
                if b[i] == '/' && at(i + 1) == Some('*') {
                    depth += 1;
                    i += 2;
                } else if b[i] == '*' && at(i + 1) == Some('/') {
                    depth -= 1;
                    i += 2;
                    if depth == 0 {
                        break;
                    }
                } else {
                    i += 1;
                }
            }
            newlines(&mut out, start, i);
        } else if c == 'r'
            && matches!(at(i + 1), Some('"') | Some('#'))
            && (!prev_ident || (b[i - 1] == 'b' && !(i > 1 && is_ident_char(b[i - 2]))))
        {
            // A raw string `r"…"`, `r#"…"#` (or `br…`), unless it is a raw identifier `r#name`.
            let mut j = i + 1;
            let mut hashes = 0;
            while at(j) == Some('#') {
                hashes += 1;
                j += 1;
            }
            if at(j) != Some('"') {
                out.push(c);
                i += 1;
                continue;
            }
            j += 1;
            while j < b.len() && !(b[j] == '"' && (1..=hashes).all(|k| at(j + k) == Some('#'))) {
                j += 1;
            }
            out.push_str("\"\"");
            newlines(&mut out, i, j);
            i = j + 1 + hashes;
        } else if c == '"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != '"' {
                j += if b[j] == '\\' { 2 } else { 1 };
            }
            out.push_str("\"\"");
            newlines(&mut out, i, j);
            i = j + 1;
        } else if c == '\'' && at(i + 1) == Some('\\') {
            // An escaped char literal: `'\n'`, `'\''`, `'\u{1F600}'`.
            let mut j = i + 3;
            while j < b.len() && b[j] != '\'' {
                j += 1;
            }
            out.push_str("' '");
            i = j + 1;
        } else if c == '\'' && at(i + 2) == Some('\'') {
            out.push_str("' '");
            i += 3;
        } else {
            out.push(c); // a lifetime's quote falls here too
            i += 1;
        }
    }
    out
}

/// Attributes whose items are not code of the layer: tests, and imports for doc links.
const NOT_CODE: [&str; 2] = ["#[cfg(test)]", "#[cfg(doc)]"];

/// `code` without the items under [`NOT_CODE`] (up to their `;` or their closing brace).
fn remove_test_items(code: &str) -> String {
    let mut out = String::with_capacity(code.len());
    let mut rest = code;
    let next = |r: &str| NOT_CODE.iter().filter_map(|a| r.find(a).map(|i| (i, a.len()))).min();
    while let Some((i, attr_len)) = next(rest) {
        out.push_str(&rest[..i]);
        let item = &rest[i..];
        let mut depth = 0i32;
        let mut end = item.len();
        for (k, c) in item.char_indices().skip(attr_len) {
            match c {
                '(' | '[' | '{' => depth += 1,
                ')' | ']' => depth -= 1,
                '}' => {
                    depth -= 1;
                    if depth == 0 {
                        end = k + 1;
                        break;
                    }
                }
                ';' if depth == 0 => {
                    end = k + 1;
                    break;
                }
                _ => {}
            }
        }
        out.extend(item[..end].chars().filter(|c| *c == '\n'));
        rest = &item[end..];
    }
    out.push_str(rest);
    out
}

/// One token: an identifier (keywords included), `::`, or one other character.
#[derive(Clone, Debug, PartialEq)]
struct Token {
    text: String,
    line: usize,
}

fn tokens(code: &str) -> Vec<Token> {
    let mut out = Vec::new();
    let mut line = 1;
    let mut chars = code.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\n' {
            line += 1;
        } else if c.is_whitespace() {
        } else if is_ident_char(c) {
            let mut text = c.to_string();
            while let Some(&n) = chars.peek().filter(|n| is_ident_char(**n)) {
                text.push(n);
                chars.next();
            }
            out.push(Token { text, line });
        } else if c == ':' && chars.peek() == Some(&':') {
            chars.next();
            out.push(Token { text: "::".into(), line });
        } else {
            out.push(Token { text: c.to_string(), line });
        }
    }
    out
}

/// A module path named by a file.
#[derive(Clone, Debug, PartialEq)]
pub struct Named {
    /// The segments as written (`["super", "engine", "Comm"]`); a glob ends in `*`.
    pub segs: Vec<String>,
    /// The inline modules (`mod name { … }`) the path stands in, outermost first.
    pub inline: Vec<String>,
    /// In a `use` declaration.
    pub in_use: bool,
    /// In a `pub`/`pub(…)` `use` declaration: a re-export.
    pub reexport: bool,
    /// The name the path is bound to in its module (the last segment or the `as` alias).
    pub bound: String,
    /// Its line in the file.
    pub line: usize,
}

/// What one file declares and names.
#[derive(Debug, Default)]
pub struct Reading {
    /// Every path of two or more segments, and every `use` leaf.
    pub named: Vec<Named>,
    /// Modules declared, by inline-module prefix: `(inline, name, has_file)`; `mod x;` has a
    /// file, `mod x { … }` does not.
    pub mods: Vec<(Vec<String>, String, bool)>,
    /// Names of the items it defines (`fn`, `struct`, `enum`, `trait`, `type`, `const`,
    /// `static`, `union`, `macro_rules!`), at any depth.
    pub defines: Vec<String>,
    /// The `macro_rules!` it defines under `#[macro_export]`: Rust names them at the crate
    /// root (`crate::name`), but they are defined (and depended on) here.
    pub exported_macros: Vec<String>,
    /// How many times each identifier occurs bare (not after `::` or `.`) outside `use`
    /// declarations.
    pub idents_outside_use: std::collections::BTreeMap<String, usize>,
}

/// Reads the module structure of `code` (from [`code_of`]).
pub fn read(code: &str) -> Reading {
    let t = tokens(code);
    let mut r = Reading::default();
    // The open braces: Some(name) where an inline module opened it.
    let mut braces: Vec<Option<String>> = Vec::new();
    let inline = |braces: &Vec<Option<String>>| braces.iter().flatten().cloned().collect::<Vec<_>>();
    let text = |k: usize| t.get(k).map(|x| x.text.as_str()).unwrap_or("");
    let mut i = 0;
    while i < t.len() {
        let w = text(i);
        match w {
            "{" => {
                let opened_by_mod = i >= 2 && text(i - 2) == "mod";
                braces.push(opened_by_mod.then(|| text(i - 1).to_string()));
            }
            "}" => {
                braces.pop();
            }
            "mod" if text(i + 2) == ";" || text(i + 2) == "{" => {
                r.mods.push((inline(&braces), text(i + 1).to_string(), text(i + 2) == ";"));
            }
            "fn" | "struct" | "enum" | "trait" | "type" | "const" | "static" | "union"
                if text(i + 1).chars().next().is_some_and(|c| c.is_alphabetic() || c == '_') =>
            {
                r.defines.push(text(i + 1).to_string());
            }
            "macro_rules" if text(i + 1) == "!" => {
                r.defines.push(text(i + 2).to_string());
                if macro_exported(&t, i) {
                    r.exported_macros.push(text(i + 2).to_string());
                }
            }
            "use" if text(i + 1) != "<" => {
                let reexport = visibility_before(&t, i);
                let mut j = i + 1;
                let ctx = (inline(&braces), reexport, t[i].line);
                use_tree(&t, &mut j, Vec::new(), &ctx, &mut r.named);
                i = j;
                continue;
            }
            _ => {}
        }
        let starts_path = is_ident_char(w.chars().next().unwrap_or(' '))
            && text(i + 1) == "::"
            && !(i > 0 && (text(i - 1) == "::" || text(i - 1) == "$"));
        if starts_path {
            let mut segs = vec![w.to_string()];
            let mut j = i + 1;
            while text(j) == "::" && text(j + 1).chars().next().is_some_and(is_ident_char) {
                segs.push(text(j + 1).to_string());
                j += 2;
            }
            let bound = segs.last().cloned().unwrap_or_default();
            r.named.push(Named {
                segs,
                inline: inline(&braces),
                in_use: false,
                reexport: false,
                bound,
                line: t[i].line,
            });
        }
        // A name used bare (not a later segment of a path, a field or a method).
        if w.chars().next().is_some_and(is_ident_char) && !(i > 0 && matches!(text(i - 1), "::" | ".")) {
            *r.idents_outside_use.entry(w.to_string()).or_default() += 1;
        }
        i += 1;
    }
    r
}

/// Whether one of the attributes right before `t[i]` is `#[macro_export]`.
fn macro_exported(t: &[Token], i: usize) -> bool {
    let mut end = i;
    while end >= 1 && t[end - 1].text == "]" {
        // The `[` that opens this attribute.
        let mut depth = 0;
        let mut k = end - 1;
        loop {
            match t[k].text.as_str() {
                "]" => depth += 1,
                "[" => depth -= 1,
                _ => {}
            }
            if depth == 0 {
                break;
            }
            if k == 0 {
                return false;
            }
            k -= 1;
        }
        if k == 0 || t[k - 1].text != "#" {
            return false;
        }
        if t[k + 1].text == "macro_export" {
            return true;
        }
        end = k - 1;
    }
    false
}

/// Whether the `use` at `t[i]` is preceded by a visibility (`pub`, `pub(crate)`, …).
fn visibility_before(t: &[Token], i: usize) -> bool {
    if i >= 1 && t[i - 1].text == "pub" {
        return true;
    }
    if i >= 1 && t[i - 1].text == ")" {
        if let Some(open) = t[..i - 1].iter().rposition(|x| x.text == "(") {
            return open >= 1 && t[open - 1].text == "pub";
        }
    }
    false
}

/// Reads one use tree from `t[*j]` (`a::b::{c, d as e, f::*}`), up to and past its `;`.
fn use_tree(t: &[Token], j: &mut usize, prefix: Vec<String>, ctx: &(Vec<String>, bool, usize), out: &mut Vec<Named>) {
    let text = |k: usize| t.get(k).map(|x| x.text.as_str()).unwrap_or(";");
    let mut segs = prefix;
    if text(*j) == "::" {
        *j += 1;
    }
    loop {
        let w = text(*j);
        if w == "{" {
            *j += 1;
            while text(*j) != "}" && text(*j) != ";" {
                use_tree(t, j, segs.clone(), ctx, out);
                if text(*j) == "," {
                    *j += 1;
                }
            }
            *j += 1; // the `}`
            break;
        }
        if w == "*" {
            segs.push("*".into());
            *j += 1;
            out.push(Named {
                segs,
                inline: ctx.0.clone(),
                in_use: true,
                reexport: ctx.1,
                bound: "*".into(),
                line: ctx.2,
            });
            break;
        }
        if !w.chars().next().is_some_and(is_ident_char) {
            break;
        }
        segs.push(w.to_string());
        *j += 1;
        if text(*j) == "::" {
            *j += 1;
            continue;
        }
        if segs.last().is_some_and(|s| s == "self") && segs.len() > 1 {
            segs.pop();
        }
        let mut bound = segs.last().cloned().unwrap_or_default();
        if text(*j) == "as" {
            bound = text(*j + 1).to_string();
            *j += 2;
        }
        out.push(Named { segs, inline: ctx.0.clone(), in_use: true, reexport: ctx.1, bound, line: ctx.2 });
        break;
    }
    // Only the outermost tree meets the `;`: a nested one ends at `,` or `}`.
    if text(*j) == ";" {
        *j += 1;
    }
}
