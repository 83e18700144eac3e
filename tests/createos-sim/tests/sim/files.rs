use createos_sim::SimConfig;

use crate::common::*;

#[test]
fn per_sandbox_isolation() {
    let _g = shared();
    let api = Api::start(fast_config());
    let a = api.create_running();
    let b = api.create_running();
    for id in [&a, &b] {
        let r = api.exec(id, &format!("echo {id} > /paperclip-workspace/x && echo {id} > /tmp/x"));
        assert_eq!(r["exit_code"], 0, "{r}");
    }
    for id in [&a, &b] {
        let r = api.exec(id, "cat /paperclip-workspace/x /tmp/x");
        assert_eq!(r["stdout"], format!("{id}\n{id}\n"));
        for p in ["/paperclip-workspace/x", "/tmp/x"] {
            let body = api
                .req(reqwest::Method::GET, &format!("/sandboxes/{id}/files?path={p}"))
                .send()
                .unwrap()
                .bytes()
                .unwrap();
            assert_eq!(&body[..], format!("{id}\n").as_bytes());
        }
    }
    // the host's /tmp is untouched
    assert_ne!(std::fs::read_to_string("/tmp/x").unwrap_or_default(), format!("{a}\n"));
    // a managed process sees the same view
    let pid = api.spawn(&b, "cat /tmp/x");
    let (frames, _) = read_frames(api.connect(&b, &pid, 0));
    assert_eq!(data_of(&frames, "stdout"), format!("{b}\n"));
}

/// A sandbox is one root filesystem, as a real one is: a rename or a hard
/// link between `/tmp` and the workspace is not a cross-device copy; the
/// system directories are read-only and the simulator's state directory
/// (another sandbox's files) is out of sight.
#[test]
fn one_root_filesystem_per_sandbox() {
    let _g = shared();
    let state = tempfile::Builder::new().prefix("createos-sim-root-test-").tempdir_in("/var/tmp").unwrap();
    let api = Api::start(SimConfig { state_dir: Some(state.path().to_path_buf()), ..fast_config() });
    let a = api.create_running();
    let b = api.create_running();
    let r = api.exec(
        &a,
        "echo moved > /tmp/s && ln /tmp/s /paperclip-workspace/linked && \
         mv -f /tmp/s /paperclip-workspace/moved && cat /paperclip-workspace/linked /paperclip-workspace/moved",
    );
    assert_eq!(r["exit_code"], 0, "{r}");
    assert_eq!(r["stdout"], "moved\nmoved\n");
    let r = api.exec(&b, &format!("test -e '{}/{a}' && echo visible || echo hidden", state.path().display()));
    assert_eq!(r["stdout"], "hidden\n", "{r}");
    let r = api.exec(&b, "touch /usr/paperclip-sim-probe 2>/dev/null && echo written || echo refused");
    assert_eq!(r["stdout"], "refused\n", "{r}");
    assert!(!std::path::Path::new("/usr/paperclip-sim-probe").exists());
    // a managed process sees the same single filesystem
    let pid =
        api.spawn(&b, "echo p > /tmp/p && mv /tmp/p /paperclip-workspace/p && cat /paperclip-workspace/p");
    let (frames, clean) = read_frames(api.connect(&b, &pid, 0));
    assert!(clean);
    assert_eq!(data_of(&frames, "stdout"), "p\n");
}

#[test]
fn files_round_trip_binary() {
    let _g = shared();
    let api = Api::start(fast_config());
    let id = api.create_running();
    let bytes: Vec<u8> = (0..=255u8).cycle().take(300_000).collect();
    let path = "/paperclip-workspace/.paperclip-runtime/blob.bin";
    let r = api
        .req(reqwest::Method::PUT, &format!("/sandboxes/{id}/files?path={path}"))
        .header("content-type", "application/octet-stream")
        .body(bytes.clone())
        .send()
        .unwrap();
    assert_eq!(r.status().as_u16(), 200);
    let got = api.req(reqwest::Method::GET, &format!("/sandboxes/{id}/files?path={path}")).send().unwrap();
    assert_eq!(got.status().as_u16(), 200);
    assert_eq!(got.bytes().unwrap().to_vec(), bytes);
    let r = api.exec(&id, &format!("sha256sum < {path} | cut -c1-16; wc -c < {path}"));
    assert_eq!(r["stdout"].as_str().unwrap().lines().nth(1), Some("300000"));
    // written by a process, read through /files
    api.exec(&id, "printf '\\x00\\xff\\x01' > /tmp/bin");
    let got = api
        .req(reqwest::Method::GET, &format!("/sandboxes/{id}/files?path=/tmp/bin"))
        .send()
        .unwrap()
        .bytes()
        .unwrap();
    assert_eq!(&got[..], &[0u8, 255, 1]);
    // outside the sandbox, traversal, symlink escapes, missing
    for bad in ["/etc/passwd", "/tmp/../etc/passwd", "relative", "/tmp"] {
        let s = api
            .req(reqwest::Method::GET, &format!("/sandboxes/{id}/files?path={bad}"))
            .send()
            .unwrap()
            .status();
        assert_eq!(s.as_u16(), 400, "{bad}");
    }
    api.exec(&id, "ln -s /etc /paperclip-workspace/etc; ln -s /etc/hostname /tmp/h");
    for esc in ["/paperclip-workspace/etc/hostname", "/tmp/h"] {
        let s = api
            .req(reqwest::Method::GET, &format!("/sandboxes/{id}/files?path={esc}"))
            .send()
            .unwrap()
            .status();
        assert_eq!(s.as_u16(), 400, "{esc}");
    }
    let s = api
        .req(reqwest::Method::GET, &format!("/sandboxes/{id}/files?path=/tmp/none"))
        .send()
        .unwrap()
        .status();
    assert_eq!(s.as_u16(), 404);
}
