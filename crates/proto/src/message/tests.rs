//! Every message round-trips; malformed bodies are errors, never panics or huge allocations.

use proptest::prelude::*;

use super::*;

use super::samples::{requests as sample_requests, responses as sample_responses};

#[test]
fn every_request_round_trips() {
    for request in sample_requests() {
        let mut body = Vec::new();
        request.encode(&mut body);
        assert_eq!(Request::decode(&body), Ok(request));
    }
}

#[test]
fn every_response_round_trips() {
    for response in sample_responses() {
        let mut body = Vec::new();
        response.encode(&mut body);
        assert_eq!(Response::decode(&body), Ok(response));
    }
}

#[test]
fn hello_with_wrong_magic_is_rejected() {
    let mut body = vec![1];
    body.extend_from_slice(b"XXXX");
    assert!(matches!(Request::decode(&body), Err(DecodeError::InvalidValue { field: "hello magic", .. })));
}

#[test]
fn trailing_bytes_and_unknown_tags_are_rejected() {
    let mut body = Vec::new();
    Request::Ping.encode(&mut body);
    body.push(0);
    assert_eq!(Request::decode(&body), Err(DecodeError::TrailingBytes(1)));
    assert_eq!(Request::decode(&[99]), Err(DecodeError::UnknownMessage(99)));
    assert!(Response::decode(&[128, 0, 0, 0, 0]).is_err(), "errno 0 is not an error");
}

proptest! {
    /// Any byte string either decodes or fails cleanly; it never panics.
    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..200)) {
        let _ = Request::decode(&body);
        let _ = Response::decode(&body);
    }

    /// Every prefix of a valid message is an error, never a different valid message.
    #[test]
    fn truncated_messages_fail(cut in 0usize..64) {
        for request in sample_requests() {
            let mut body = Vec::new();
            request.encode(&mut body);
            if cut < body.len() {
                prop_assert!(Request::decode(&body[..cut]).is_err());
            }
        }
    }
}

#[test]
fn a_member_lists_digest_tells_what_gossip_compares_and_nothing_else() {
    let member = |name: &str, incarnation: u64| Member {
        name: name.into(),
        tcp_address: format!("{name}:1"),
        unix_path: String::new(),
        host_id: 1,
        pid: 1,
        alive: true,
        incarnation,
    };
    let list = MemberList { epoch: 3, placement: "modular/koyama".into(), members: vec![member("a", 1), member("b", 2)] };
    let digest = list.digest();
    let mut reordered = list.clone();
    reordered.members.reverse();
    reordered.epoch = 9;
    assert_eq!(reordered.digest(), digest, "neither the order nor the epoch counts");
    let changed = |change: &dyn Fn(&mut MemberList)| {
        let mut other = list.clone();
        change(&mut other);
        other.digest()
    };
    assert_ne!(changed(&|l| l.members[1].incarnation = 3), digest, "a newer incarnation");
    assert_ne!(changed(&|l| l.members[1].alive = false), digest, "a member declared dead");
    assert_ne!(changed(&|l| l.members.push(member("c", 1))), digest, "a member more");
    assert_ne!(changed(&|l| l.members[0].name = "b".into()), digest, "a name");
    assert_ne!(changed(&|l| l.placement = "consistent/koyama".into()), digest, "the placement");
    // Swapping two members' incarnations is another list.
    assert_ne!(changed(&|l| (l.members[0].incarnation, l.members[1].incarnation) = (2, 1)), digest);
}
