//! Registries as they are: TLS with a private CA, Basic and Bearer-token auth
//! from a Docker config (plain, identity token, credential helper), blob
//! redirects to another host, mirror fallback; secrets never printed.

use std::sync::Arc;

use crate::common::*;
use base64::Engine as _;
use kiln_testkit::proxy::{
    paced_proxy, redirect_proxy, token_server, token_server_lived, TOKEN_ISSUER, TOKEN_SERVICE,
};
use kiln_testkit::registry::{RegistryOptions, TokenAuth};
use kiln_testkit::tls::{make_ca, TokenSigner};

const USER: &str = "kiln-tester";
const PASS: &str = "s3cret-Pa55word";

fn docker_config(env: &Env, json: serde_json::Value) -> String {
    let dir = env.path("docker");
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("config.json"), json.to_string()).unwrap();
    dir.to_str().unwrap().to_string()
}

fn basic(user: &str, pass: &str) -> String {
    base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
}

/// The registry restarted with token auth: a token server (tokens living
/// `lifetime` seconds, else its default) for USER:PASS and the identity
/// token "refresh-me-please". Keep it while the registry is used.
fn token_auth(env: &mut Env, lifetime: Option<u64>) -> kiln_testkit::http::Server {
    let signer = Arc::new(TokenSigner::new());
    let tokens = match lifetime {
        Some(secs) => token_server_lived(signer.clone(), USER, PASS, "refresh-me-please", secs),
        None => token_server(signer.clone(), USER, PASS, "refresh-me-please"),
    };
    env.registry
        .restart_with(&RegistryOptions {
            tls: None,
            htpasswd: None,
            token: Some(TokenAuth {
                realm: format!("{}/token", tokens.url()),
                service: TOKEN_SERVICE.into(),
                issuer: TOKEN_ISSUER.into(),
                rootcertbundle: signer.cert_pem.clone(),
            }),
        })
        .unwrap();
    tokens
}

fn small_manifest(env: &Env) -> std::path::PathBuf {
    env.manifest(
        "node.yaml",
        "registry.k8s.io/pause:3.10",
        &[
            "registry.k8s.io/pause:3.10",
            "registry.k8s.io/coredns/coredns:v1.11.3",
        ],
    )
}

#[test]
fn basic_auth_over_tls_with_a_private_ca() {
    let mut env = Env::new();
    let ca = make_ca();
    env.registry
        .restart_with(&RegistryOptions {
            tls: Some((ca.cert_pem.clone(), ca.key_pem.clone(), ca.ca_pem.clone())),
            htpasswd: Some((USER.into(), PASS.into())),
            token: None,
        })
        .unwrap();
    let m = small_manifest(&env);
    let rootfs = env.path("rootfs");
    let mirror = format!("registry.k8s.io=https://{}", env.registry.addr);
    let build = |extra: &[&str], cfg: &str, log: &str| {
        let mut args = vec![
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--mirror",
            &mirror,
        ];
        args.extend(extra);
        kiln_env(&args, &[("DOCKER_CONFIG", cfg), ("RUST_LOG", log)])
    };
    let good = docker_config(
        &env,
        serde_json::json!({"auths": {env.registry.addr.clone(): {"auth": basic(USER, PASS)}}}),
    );
    let ca_arg = ca.ca_pem.to_str().unwrap();

    // No CA: the certificate is refused, clearly.
    let o = build(&[], &good, "warn");
    assert_fails(&o, 1, &["2 of 2 images failed"]);
    assert!(
        stderr(&o).to_lowercase().contains("certificate"),
        "{}",
        stderr(&o)
    );

    // No credentials: 401, with what to do.
    let none = docker_config(&env, serde_json::json!({}));
    let o = build(&["--ca-cert", ca_arg], &none, "warn");
    assert_fails(&o, 1, &["2 of 2 images failed"]);
    assert!(
        stderr(&o).contains(&format!("{} requires credentials", env.registry.addr)),
        "{}",
        stderr(&o)
    );

    // Wrong password: rejected, named as such.
    let bad = docker_config(
        &env,
        serde_json::json!({"auths": {env.registry.addr.clone(): {"username": USER, "password": "wrong"}}}),
    );
    let o = build(&["--ca-cert", ca_arg], &bad, "warn");
    assert_fails(&o, 1, &[]);
    assert!(
        stderr(&o).contains("401") && stderr(&o).contains("were rejected"),
        "{}",
        stderr(&o)
    );

    // Right credentials, traced to the last byte: works, and no secret shows.
    let good = docker_config(
        &env,
        serde_json::json!({"auths": {env.registry.addr.clone(): {"auth": basic(USER, PASS)}}}),
    );
    let o = build(&["--ca-cert", ca_arg], &good, "trace");
    assert_ok(&o);
    let all = format!("{}{}", stdout(&o), stderr(&o));
    assert!(
        !all.contains(PASS) && !all.contains(&basic(USER, PASS)),
        "a secret was printed"
    );
    let view = inspect(&rootfs);
    assert_eq!(
        report(&view, "registry.k8s.io/pause:3.10").unwrap()["pinned"],
        true
    );
}

#[test]
fn bearer_tokens_from_password_identity_token_and_credential_helper() {
    let mut env = Env::new();
    let _tokens = token_auth(&mut env, None);
    let m = small_manifest(&env);
    let host = env.registry.addr.clone();
    let run = |rootfs: &str, cfg: &str, extra_env: &[(&str, &str)]| {
        let mut envs = vec![("DOCKER_CONFIG", cfg), ("RUST_LOG", "trace")];
        envs.extend_from_slice(extra_env);
        kiln_env(
            &[
                "build",
                "--manifest",
                m.to_str().unwrap(),
                "--rootfs",
                env.path(rootfs).to_str().unwrap(),
                "--mirror",
                &env.mirror(),
            ],
            &envs,
        )
    };

    let pw = docker_config(
        &env,
        serde_json::json!({"auths": {host.clone(): {"username": USER, "password": PASS}}}),
    );
    let o = run("r1", &pw, &[]);
    assert_ok(&o);
    assert!(!stderr(&o).contains(PASS), "password printed");
    assert!(!stderr(&o).contains("Bearer ey"), "token printed");

    let idt = docker_config(
        &env,
        serde_json::json!({"auths": {host.clone(): {"identitytoken": "refresh-me-please"}}}),
    );
    let o = run("r2", &idt, &[]);
    assert_ok(&o);
    assert!(
        !stderr(&o).contains("refresh-me-please"),
        "identity token printed"
    );

    // A credential helper on PATH, as `credHelpers` names it.
    let bin = env.path("bin");
    std::fs::create_dir_all(&bin).unwrap();
    let helper = bin.join("docker-credential-kilntest");
    std::fs::write(&helper, format!("#!/bin/sh\nread server\n[ \"$1\" = get ] && [ \"$server\" = \"{host}\" ] && printf '{{\"ServerURL\":\"%s\",\"Username\":\"{USER}\",\"Secret\":\"{PASS}\"}}' \"$server\" && exit 0\necho 'credentials not found in native keychain'; exit 1\n")).unwrap();
    std::fs::set_permissions(&helper, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let h = docker_config(
        &env,
        serde_json::json!({"credHelpers": {host.clone(): "kilntest"}}),
    );
    let o = run("r3", &h, &[("PATH+", bin.to_str().unwrap())]);
    assert_ok(&o);
    assert!(!stderr(&o).contains(PASS));

    let wrong = docker_config(
        &env,
        serde_json::json!({"auths": {host.clone(): {"username": USER, "password": "nope"}}}),
    );
    let o = run("r4", &wrong, &[]);
    assert_fails(&o, 1, &[]);
    assert!(
        stderr(&o).contains("token server")
            && stderr(&o).contains("401")
            && stderr(&o).contains("rejected"),
        "{}",
        stderr(&o)
    );
    for r in ["r1", "r2", "r3"] {
        assert_all_pinned_complete(&env.path(r), Some(2));
    }
}

#[test]
fn redirected_blobs_are_followed_without_the_registry_credentials() {
    let mut env = Env::new();
    env.registry
        .restart_with(&RegistryOptions {
            htpasswd: Some((USER.into(), PASS.into())),
            ..Default::default()
        })
        .unwrap();
    let data = env
        .registry
        .blob_data_path("sha256:0000000000000000000000000000000000000000000000000000000000000000");
    let root = data.ancestors().nth(3).unwrap().to_path_buf();
    let proxy = redirect_proxy(env.registry.url(), None, move |d| {
        root.join(&d[7..9]).join(&d[7..]).join("data")
    });
    let host = proxy.server.addr.to_string();
    let cfg = docker_config(
        &env,
        serde_json::json!({"auths": {host.clone(): {"auth": basic(USER, PASS)}}}),
    );
    let m = small_manifest(&env);
    let rootfs = env.path("rootfs");
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--rootfs",
            rootfs.to_str().unwrap(),
            "--mirror",
            &format!("registry.k8s.io=http://{host}"),
        ],
        &[("DOCKER_CONFIG", &cfg)],
    );
    assert_ok(&o);
    let seen = proxy.cdn_requests.lock().unwrap().clone();
    assert!(!seen.is_empty(), "no blob went through the redirect");
    assert!(
        seen.iter().all(Option::is_none),
        "the CDN host was sent credentials: {seen:?}"
    );
    assert_all_pinned_complete(&rootfs, None);
}

#[test]
fn mirrors_fall_back_in_order() {
    let env = Env::new();
    let dead = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap();
    let m = small_manifest(&env);
    let rootfs = env.path("rootfs");
    // A registries file: a dead mirror first, then the live one.
    let cfg = env.write("registries.yaml", &format!("registries:\n  registry.k8s.io:\n    mirrors:\n      - url: http://{dead}\n      - url: {}\n", env.registry.url()));
    let o = kiln(&[
        "build",
        "--manifest",
        m.to_str().unwrap(),
        "--rootfs",
        rootfs.to_str().unwrap(),
        "--registry-config",
        cfg.to_str().unwrap(),
    ]);
    assert_ok(&o);
    assert_eq!(inspect(&rootfs).as_array().unwrap().len(), 2);
}

/// Issue 44.4: a push that outlasts its registry's tokens (3 s here, as
/// Docker Hub's 300 s are to a long push) still lands: the mount is tried
/// and the upload session opened right before each PUT, after the copy
/// engine's permit, and a PUT refused for an expired token is sent again
/// with a renewed one. `--jobs 1` through a link that holds each upload
/// 1 s (less than a token lives, as a PUT starts within seconds of its
/// session in real life; a token's `exp` is in whole seconds, so a "3 s"
/// token lives 2 to 3). (The old code opened every session at the start
/// and sent each PUT with whatever token it had cached: refused once it
/// ran out.)
#[test]
fn a_long_push_outlives_its_tokens() {
    let mut env = Env::new();
    env.registry
        .push(&kiln_testkit::base::kind_base(&[
            &kiln_testkit::image::host_platform(),
        ]))
        .unwrap();
    let _tokens = token_auth(&mut env, Some(3));
    let proxy = paced_proxy(env.registry.url(), std::time::Duration::from_secs(1));
    let host = proxy.addr();
    let cfg = docker_config(
        &env,
        serde_json::json!({"auths": {host.clone(): {"username": USER, "password": PASS}}}),
    );
    let m = env.manifest("node.yaml", "registry.k8s.io/pause:3.10", ALL);
    let mirror = format!("registry.k8s.io={}", proxy.server.url());
    let base = format!("{host}/kindest/base:test");
    let target = format!("{host}/kiln/node:long");
    let o = kiln_env(
        &[
            "build",
            "--manifest",
            m.to_str().unwrap(),
            "--base",
            &base,
            "--mirror",
            &mirror,
            "--push",
            &target,
            "--jobs",
            "1",
            "--json",
        ],
        &[("DOCKER_CONFIG", &cfg), ("SOURCE_DATE_EPOCH", "1700000000")],
    );
    assert_ok(&o);
    let r: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    let log = proxy.take();
    let uploads = log
        .iter()
        .filter(|c| c.method == "PUT" && c.target.contains("/blobs/uploads/") && c.status == 201)
        .count() as u64;
    eprintln!(
        "{uploads} uploads held 1 s each with 3 s tokens; {}",
        r["pushed"]
    );
    assert_eq!(uploads, r["pushed"]["uploaded"].as_u64().unwrap());
    // Long enough that the first token ran out during the push.
    assert!(uploads >= 4, "{uploads} uploads: too short a push to test");
    assert_eq!(r["pushed"]["mounted"], 2, "the base's layers are mounted");
    let tagged = log
        .iter()
        .any(|c| c.method == "PUT" && c.target.ends_with("/manifests/long") && c.status == 201);
    assert!(tagged, "the tag was not pushed");
}
