//! TLS from the URL's `sslmode`, against a private cluster that serves a
//! certificate made here: a throwaway CA signs a server certificate for
//! `localhost` (and not for `127.0.0.1`), so each mode's checks show.

use std::path::Path;
use std::process::Command;

use waymark_pool::{PgPool, SslMode};
use waymark_store::{ExecError, PgExecutor};
use waymark_tests::private_cluster::PrivateCluster;

/// Makes a CA and a server certificate for `localhost` in `dir`; returns
/// (ca.pem, server.crt, server.key) contents.
fn make_certificates(dir: &Path) -> (Vec<u8>, Vec<u8>, Vec<u8>) {
    let openssl = |args: &[&str]| {
        let out = Command::new("openssl").args(args).current_dir(dir).output().expect("openssl runs");
        assert!(out.status.success(), "openssl {args:?}: {}", String::from_utf8_lossy(&out.stderr));
    };
    std::fs::write(
        dir.join("server.ext"),
        "basicConstraints=CA:FALSE\nkeyUsage=digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\nsubjectAltName=DNS:localhost\n",
    )
    .expect("extensions file");
    openssl(&[
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-days",
        "2",
        "-subj",
        "/CN=waymark test ca",
        "-keyout",
        "ca.key",
        "-out",
        "ca.pem",
    ]);
    openssl(&[
        "req",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:P-256",
        "-nodes",
        "-subj",
        "/CN=localhost",
        "-keyout",
        "server.key",
        "-out",
        "server.csr",
    ]);
    openssl(&[
        "x509",
        "-req",
        "-in",
        "server.csr",
        "-CA",
        "ca.pem",
        "-CAkey",
        "ca.key",
        "-CAcreateserial",
        "-days",
        "2",
        "-extfile",
        "server.ext",
        "-out",
        "server.crt",
    ]);
    let read = |name: &str| std::fs::read(dir.join(name)).expect("certificate file");
    (read("ca.pem"), read("server.crt"), read("server.key"))
}

/// Whether the pool's connection is encrypted, as the server sees it.
async fn uses_ssl(pool: &PgPool) -> Result<bool, ExecError> {
    let tx = pool.begin().await?;
    let row = tx
        .client()
        .query_one("select ssl from pg_stat_ssl where pid = pg_backend_pid()", &[])
        .await
        .expect("pg_stat_ssl");
    Ok(row.get::<_, bool>(0))
}

fn pool(url: String) -> PgPool {
    PgPool::builder(url).max_size(1).retry_attempts(0).build().expect("pool")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sslmode_from_the_url_encrypts_and_verifies_as_libpq_does() {
    let cluster = tokio::task::spawn_blocking(|| PrivateCluster::start("tls")).await.expect("cluster");
    let port = cluster.port();
    let url = |host: &str, query: &str| format!("postgres://postgres@{host}:{port}/postgres?{query}");

    // No TLS on the server yet: `require` refuses a plain connection.
    let err = uses_ssl(&pool(url("127.0.0.1", "sslmode=require"))).await.expect_err("server has no tls");
    assert!(err.to_string().to_lowercase().contains("tls") || err.to_string().contains("ssl"), "{err}");
    assert!(!uses_ssl(&pool(url("127.0.0.1", "sslmode=prefer"))).await.expect("prefer falls back"));

    let work = tempdir();
    let (ca, crt, key) = make_certificates(&work);
    cluster.write_private_file("server.crt", &crt);
    cluster.write_private_file("server.key", &key);
    let admin = waymark_tests::db::admin_client(&url("127.0.0.1", "sslmode=disable")).await;
    admin.batch_execute("alter system set ssl = on").await.expect("ssl on");
    admin.query_one("select pg_reload_conf()", &[]).await.expect("reload");
    let ca_path = work.join("ca.pem");
    std::fs::write(&ca_path, &ca).expect("ca file");
    let root = format!("sslrootcert={}", ca_path.display());

    // Reloading takes a moment to reach new backends.
    let required = pool(url("127.0.0.1", "sslmode=require"));
    waymark_tests::eventually(
        std::time::Duration::from_secs(5),
        "require: an encrypted connection once the server offers tls",
        || async { matches!(uses_ssl(&required).await, Ok(true)) },
    )
    .await;
    assert_eq!(required.ssl_mode(), SslMode::Require);

    assert!(!uses_ssl(&pool(url("127.0.0.1", "sslmode=disable"))).await.expect("disable"));
    assert!(uses_ssl(&pool(url("127.0.0.1", "sslmode=prefer"))).await.expect("prefer takes tls"));

    // verify-full: the chain and the name must both hold.
    let full = pool(url("localhost", &format!("sslmode=verify-full&{root}")));
    assert!(uses_ssl(&full).await.expect("verify-full to localhost"));
    let wrong_name = uses_ssl(&pool(url("127.0.0.1", &format!("sslmode=verify-full&{root}"))))
        .await
        .expect_err("the certificate does not name 127.0.0.1");
    assert!(wrong_name.to_string().contains("certificate"), "{wrong_name}");
    // verify-ca: the chain only.
    assert!(uses_ssl(&pool(url("127.0.0.1", &format!("sslmode=verify-ca&{root}"))))
        .await
        .expect("verify-ca"));
    // `require` with a root certificate checks the chain, as libpq does.
    let with_root = pool(url("127.0.0.1", &format!("sslmode=require&{root}")));
    assert_eq!(with_root.ssl_mode(), SslMode::VerifyCa);
    assert!(uses_ssl(&with_root).await.expect("require + sslrootcert"));
    // The system roots do not trust the throwaway CA.
    let untrusted = uses_ssl(&pool(url("localhost", "sslmode=verify-full&sslrootcert=system")))
        .await
        .expect_err("system roots do not know the test ca");
    assert!(untrusted.to_string().contains("certificate"), "{untrusted}");
    let _ = std::fs::remove_dir_all(&work);
}

fn tempdir() -> std::path::PathBuf {
    let dir =
        waymark_tests::cluster::target_dir().join(format!("waymark-tls-{:016x}", rand::random::<u64>()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    dir
}
