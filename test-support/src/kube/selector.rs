//! Label selectors as the API server matches them (apimachinery
//! `pkg/labels/selector.go`, `Parse` and `Requirement.Matches`): comma-separated
//! requirements, all of which must hold; `key` and `!key` test existence,
//! `key=v` / `key==v` / `key!=v` equality, `key in (a,b)` / `key notin (a,b)`
//! set membership (`!=` and `notin` also match objects without the label).

use serde_json::Value;

/// Whether `obj`'s `metadata.labels` satisfy `selector` (empty: everything).
pub(super) fn matches(obj: &Value, selector: &str) -> bool {
    let labels = &obj["metadata"]["labels"];
    let get = |k: &str| labels.get(k).and_then(Value::as_str);
    split(selector).into_iter().all(|req| {
        let req = req.trim();
        if req.is_empty() {
            return true;
        }
        if let Some(k) = req.strip_prefix('!') {
            return get(k.trim()).is_none();
        }
        if let Some((k, set)) = req.split_once(" notin ") {
            return get(k.trim()).is_none_or(|v| !in_set(set, v));
        }
        if let Some((k, set)) = req.split_once(" in ") {
            return get(k.trim()).is_some_and(|v| in_set(set, v));
        }
        if let Some((k, v)) = req.split_once("!=") {
            return get(k.trim()) != Some(v.trim());
        }
        if let Some((k, v)) = req.split_once("==").or_else(|| req.split_once('=')) {
            return get(k.trim()) == Some(v.trim());
        }
        get(req).is_some()
    })
}

fn in_set(set: &str, v: &str) -> bool {
    set.trim()
        .trim_start_matches('(')
        .trim_end_matches(')')
        .split(',')
        .any(|x| x.trim() == v)
}

/// Splits at the commas outside `( )`.
fn split(sel: &str) -> Vec<&str> {
    let (mut out, mut depth, mut start) = (Vec::new(), 0u32, 0);
    for (i, c) in sel.char_indices() {
        match c {
            '(' => depth += 1,
            ')' => depth = depth.saturating_sub(1),
            ',' if depth == 0 => {
                out.push(&sel[start..i]);
                start = i + 1;
            }
            _ => {}
        }
    }
    out.push(&sel[start..]);
    out
}

/// A list response: the items as they are, or as `PartialObjectMetadata` when
/// the client asked for metadata only (`Accept:
/// application/json;as=PartialObjectMetadataList;g=meta.k8s.io;v=v1`; apiserver
/// `pkg/endpoints/handlers/response.go`, `asPartialObjectMetadataList`).
pub(super) fn list_body(
    kind: &str,
    api_version: &str,
    items: Vec<Value>,
    rv: u64,
    accept: &str,
    cont: Option<String>,
) -> Value {
    let mut meta = serde_json::json!({"resourceVersion": rv.to_string()});
    if let Some(c) = cont {
        meta["continue"] = Value::String(c);
    }
    if accept.contains("as=PartialObjectMetadataList") {
        let items: Vec<Value> = items
            .into_iter()
            .map(|o| serde_json::json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": o["metadata"].clone()}))
            .collect();
        serde_json::json!({"kind": "PartialObjectMetadataList", "apiVersion": "meta.k8s.io/v1", "metadata": meta, "items": items})
    } else {
        serde_json::json!({"kind": format!("{kind}List"), "apiVersion": api_version, "metadata": meta, "items": items})
    }
}

/// One object as `PartialObjectMetadata` when the client asked for it
/// (`Accept: ...;as=PartialObjectMetadata;...`), else as it is.
pub(super) fn object_body(obj: &Value, accept: &str) -> Value {
    if accept.contains("as=PartialObjectMetadata")
        && !accept.contains("as=PartialObjectMetadataList")
    {
        serde_json::json!({"kind": "PartialObjectMetadata", "apiVersion": "meta.k8s.io/v1", "metadata": obj["metadata"].clone()})
    } else {
        obj.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn requirements_match_as_the_api_server_matches_them() {
        let o = json!({"metadata": {"labels": {"nvidia.com/gpu.present": "true", "zone": "a"}}});
        for (sel, want) in [
            ("", true),
            ("nvidia.com/gpu.present=true", true),
            ("nvidia.com/gpu.present==true", true),
            ("nvidia.com/gpu.present!=true", false),
            ("nvidia.com/gpu.present", true),
            ("!nvidia.com/gpu.present", false),
            ("missing!=x", true),
            ("zone in (a,b)", true),
            ("zone notin (a,b)", false),
            ("missing notin (a)", true),
            ("nvidia.com/gpu.present=true,zone=b", false),
        ] {
            assert_eq!(matches(&o, sel), want, "{sel}");
        }
    }
}
