//! Supervised fine-tuning examples from JSON lines: `prompt`/`response` fields, or a chat
//! `messages` list rendered with a fixed template.
//!
//! **Chat template.** Every message before the last assistant message is rendered as
//! `"<|{role}|>\n{content}\n"`, in order; then `"<|assistant|>\n"` ends the prompt. The
//! response is the last assistant message's content, as is; Ember appends the EOS. So
//! `[{"role":"user","content":"Hi"},{"role":"assistant","content":"Hello!"}]` gives the prompt
//! `"<|user|>\nHi\n<|assistant|>\n"` and the response `"Hello!"`. Prompt/response examples are
//! used as given (prompt + response, no template).

use serde_json::{Map, Value};

/// Field names of SFT examples.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SftFields {
    /// Field holding the prompt (default `"prompt"`).
    pub prompt_field: String,
    /// Field holding the response (default `"response"`).
    pub response_field: String,
}

impl Default for SftFields {
    fn default() -> Self {
        SftFields { prompt_field: "prompt".into(), response_field: "response".into() }
    }
}

/// A JSON value's type, for messages.
fn type_name(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// The string field `name` of `obj`; the error says what was found instead.
pub(crate) fn string_field<'a>(obj: &'a Map<String, Value>, name: &str) -> Result<&'a str, String> {
    match obj.get(name) {
        Some(Value::String(s)) => Ok(s),
        Some(other) => Err(format!("field {name:?} must be a string, found {}", type_name(other))),
        None => {
            let keys: Vec<&str> = obj.keys().map(String::as_str).collect();
            Err(format!("missing field {name:?} (the object has {keys:?})"))
        }
    }
}

/// Renders chat `messages` with the module's template into `(prompt, response)`.
fn render_messages(messages: &[Value]) -> Result<(String, String), String> {
    let mut parsed = Vec::with_capacity(messages.len());
    for (i, m) in messages.iter().enumerate() {
        let Value::Object(obj) = m else {
            return Err(format!(
                "messages[{i}] must be an object with role and content, found {}",
                type_name(m)
            ));
        };
        let role = string_field(obj, "role").map_err(|e| format!("messages[{i}]: {e}"))?;
        let content = string_field(obj, "content").map_err(|e| format!("messages[{i}]: {e}"))?;
        parsed.push((role, content));
    }
    let last = parsed
        .iter()
        .rposition(|(role, _)| *role == "assistant")
        .ok_or("messages has no message with role \"assistant\" (the response)")?;
    if last + 1 != parsed.len() {
        return Err(format!(
            "messages[{}] comes after the last assistant message; the response must be the last message",
            last + 1
        ));
    }
    let mut prompt = String::new();
    for (role, content) in &parsed[..last] {
        prompt.push_str(&format!("<|{role}|>\n{content}\n"));
    }
    prompt.push_str("<|assistant|>\n");
    Ok((prompt, parsed[last].1.to_string()))
}

/// Reads one SFT example from a JSON object: `messages` if present, else the prompt and
/// response fields. The error (without file and line, which the caller adds) names the field.
pub(crate) fn parse_example(
    obj: &Map<String, Value>,
    fields: &SftFields,
) -> Result<(String, String), String> {
    if let Some(messages) = obj.get("messages") {
        let Value::Array(list) = messages else {
            return Err(format!("field \"messages\" must be an array, found {}", type_name(messages)));
        };
        return render_messages(list);
    }
    let prompt = string_field(obj, &fields.prompt_field)
        .map_err(|e| format!("{e}; an SFT line needs \"messages\" or prompt/response fields"))?;
    let response = string_field(obj, &fields.response_field)?;
    Ok((prompt.to_string(), response.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn obj(json: &str) -> Map<String, Value> {
        serde_json::from_str(json).unwrap()
    }

    #[test]
    fn prompt_response_fields() {
        let f = SftFields::default();
        let got = parse_example(&obj(r#"{"prompt":"Q: 1+1?\nA: ","response":"2"}"#), &f).unwrap();
        assert_eq!(got, ("Q: 1+1?\nA: ".to_string(), "2".to_string()));
        let f = SftFields { prompt_field: "q".into(), response_field: "a".into() };
        assert_eq!(parse_example(&obj(r#"{"q":"x","a":"y"}"#), &f).unwrap(), ("x".into(), "y".into()));
        let err = parse_example(&obj(r#"{"q":"x"}"#), &f).unwrap_err();
        assert!(err.contains("missing field \"a\""), "{err}");
        let err = parse_example(&obj(r#"{"q":1,"a":"y"}"#), &f).unwrap_err();
        assert!(err.contains("\"q\" must be a string, found a number"), "{err}");
    }

    #[test]
    fn messages_template() {
        let f = SftFields::default();
        let line = r#"{"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi"},
            {"role":"assistant","content":"Hello"},{"role":"user","content":"Bye"},{"role":"assistant","content":"Bye!"}]}"#;
        let (p, r) = parse_example(&obj(line), &f).unwrap();
        assert_eq!(
            p,
            "<|system|>\nBe brief.\n<|user|>\nHi\n<|assistant|>\nHello\n<|user|>\nBye\n<|assistant|>\n"
        );
        assert_eq!(r, "Bye!");
    }

    #[test]
    fn messages_errors() {
        let f = SftFields::default();
        let err = parse_example(&obj(r#"{"messages":[{"role":"user","content":"Hi"}]}"#), &f).unwrap_err();
        assert!(err.contains("no message with role \"assistant\""), "{err}");
        let line = r#"{"messages":[{"role":"assistant","content":"a"},{"role":"user","content":"b"}]}"#;
        assert!(parse_example(&obj(line), &f).unwrap_err().contains("messages[1] comes after"));
        let err = parse_example(&obj(r#"{"messages":[{"role":"user"}]}"#), &f).unwrap_err();
        assert!(err.contains("messages[0]: missing field \"content\""), "{err}");
    }
}
