//! Server-sent events as `GET /v1/events` streams them: one message per
//! blank-line-ended block of `id:`, `event:` and `data:` lines; comment
//! lines (the keep-alives) are skipped.

/// One server-sent message.
#[derive(Debug, Default, PartialEq)]
pub struct SseMessage {
    pub id: Option<String>,
    pub event: String,
    pub data: String,
}

/// Reads the next message from an event stream; None at its end.
pub fn read_sse(r: &mut impl std::io::BufRead) -> std::io::Result<Option<SseMessage>> {
    let mut m = SseMessage::default();
    let mut any = false;
    let mut line = String::new();
    loop {
        line.clear();
        if r.read_line(&mut line)? == 0 {
            return Ok(None);
        }
        let l = line.trim_end_matches(['\r', '\n']);
        if l.is_empty() {
            if any {
                return Ok(Some(m));
            }
            continue;
        }
        if l.starts_with(':') {
            continue; // a keep-alive comment
        }
        let (field, value) = l.split_once(':').unwrap_or((l, ""));
        let value = value.strip_prefix(' ').unwrap_or(value);
        any = true;
        match field {
            "id" => m.id = Some(value.to_string()),
            "event" => m.event = value.to_string(),
            "data" => {
                if !m.data.is_empty() {
                    m.data.push('\n');
                }
                m.data.push_str(value);
            }
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sse_messages_are_read_whole() {
        let text = ": keep-alive\n\nevent: hello\ndata: {\"boot\":\"b\",\"last_seq\":4}\n\n\
                    id: 5\nevent: drive_failed\ndata: {\"seq\":5}\n\n: keep-alive\n\n";
        let mut r = std::io::BufReader::new(text.as_bytes());
        let m = read_sse(&mut r).unwrap().unwrap();
        assert_eq!(m.event, "hello");
        assert_eq!(m.id, None);
        let m = read_sse(&mut r).unwrap().unwrap();
        assert_eq!(
            m,
            SseMessage {
                id: Some("5".into()),
                event: "drive_failed".into(),
                data: "{\"seq\":5}".into()
            }
        );
        assert_eq!(read_sse(&mut r).unwrap(), None);
    }
}
