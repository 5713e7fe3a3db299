//! An answer in parts (`invocationresultpart`, sent by the deployed WebSocket API when an
//! answer passes its 128 KB): one call's parts put back together, and what makes a part
//! unusable. Pure, so every hostile part is tested without a socket.

use ::bus::protocol::{RESULT_PARTS_MAX, ResultPart};

/// The parts of one call's answer that came so far.
#[derive(Debug, Default)]
pub(crate) struct PartsOf {
    slots: Vec<Option<String>>,
    got: usize,
}

impl PartsOf {
    /// Adds one part: the joined text once every part came, or what is wrong with this one
    /// (a part that cannot belong to a well-formed answer ends the call).
    pub(crate) fn add(&mut self, part: ResultPart) -> Result<Option<String>, String> {
        let ResultPart {
            index, count, text, ..
        } = part;
        if count == 0 || count > RESULT_PARTS_MAX {
            return Err(format!(
                "a part's count {count} is not from 1 to {RESULT_PARTS_MAX}"
            ));
        }
        if index >= count {
            return Err(format!(
                "a part's index {index} is not from 0 to {}",
                count - 1
            ));
        }
        if self.slots.is_empty() {
            self.slots = vec![None; count as usize];
        } else if self.slots.len() != count as usize {
            return Err(format!(
                "part {index} says {count} parts where an earlier one said {}",
                self.slots.len()
            ));
        }
        let slot = &mut self.slots[index as usize];
        if slot.is_some() {
            return Err(format!("part {index} came twice"));
        }
        *slot = Some(text);
        self.got += 1;
        if self.got < self.slots.len() {
            return Ok(None);
        }
        Ok(Some(self.slots.drain(..).flatten().collect()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn part(index: u32, count: u32, text: &str) -> ResultPart {
        ResultPart {
            invocation_id: "i1".into(),
            index,
            count,
            text: text.into(),
        }
    }

    #[test]
    fn parts_in_any_order_join_in_index_order() {
        let mut p = PartsOf::default();
        assert_eq!(p.add(part(2, 3, "c")), Ok(None));
        assert_eq!(p.add(part(0, 3, "a")), Ok(None));
        assert_eq!(p.add(part(1, 3, "b")), Ok(Some("abc".into())));
        let mut one = PartsOf::default();
        assert_eq!(one.add(part(0, 1, "whole")), Ok(Some("whole".into())));
    }

    #[test]
    fn a_part_that_cannot_belong_to_an_answer_names_what_is_wrong() {
        let cases: Vec<(Vec<ResultPart>, &str)> = vec![
            (vec![part(0, 0, "x")], "count 0 is not from 1 to 128"),
            (vec![part(0, 129, "x")], "count 129 is not from 1 to 128"),
            (vec![part(2, 2, "x")], "index 2 is not from 0 to 1"),
            (
                vec![part(0, 3, "x"), part(1, 2, "y")],
                "part 1 says 2 parts where an earlier one said 3",
            ),
            (vec![part(0, 2, "x"), part(0, 2, "x")], "part 0 came twice"),
        ];
        for (parts, says) in cases {
            let mut p = PartsOf::default();
            let last = parts.len() - 1;
            for (i, part) in parts.into_iter().enumerate() {
                let got = p.add(part);
                if i < last {
                    assert_eq!(got, Ok(None));
                } else {
                    let err = got.expect_err(says);
                    assert!(err.contains(says), "{err} / {says}");
                }
            }
        }
    }
}
