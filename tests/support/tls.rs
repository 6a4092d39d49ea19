//! A PostgreSQL that speaks TLS with a certificate of its own CA (made here with the openssl
//! CLI), and a role that must log in with a password (scram-sha-256), for tests/all/pg_tls.rs.

use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use super::Pg;

/// The role that logs in with [`PASSWORD`]; every other role keeps `trust`.
pub const PW_ROLE: &str = "member_pw";
/// [`PW_ROLE`]'s password at start. Long and unusual, so a leak is found by a plain search.
pub const PASSWORD: &str = "Pw-9f3kQ7zX-never-shown";

/// The shared cluster of this test process, started with `ssl=on`, a server certificate for
/// `localhost` and 127.0.0.1, and [`PW_ROLE`] behind scram-sha-256.
pub fn pg() -> &'static Pg {
    static ROLE: std::sync::Once = std::sync::Once::new();
    let pg = Pg::get_with(setup);
    ROLE.call_once(|| create_role(pg));
    pg
}

fn create_role(pg: &Pg) {
    let mut admin = pg.client("postgres");
    admin
        .batch_execute(&format!(
            "DO $$ BEGIN
               IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '{PW_ROLE}') THEN
                 CREATE ROLE {PW_ROLE} LOGIN SUPERUSER PASSWORD '{PASSWORD}';
               END IF;
             END $$"
        ))
        .expect("create the password role");
}

/// The data dir of the shared cluster, where the certificates are.
pub fn data_dir() -> PathBuf {
    let mut admin = pg().client("postgres");
    let row = admin.query_one("SHOW data_directory", &[]).unwrap();
    PathBuf::from(row.get::<_, String>(0))
}

/// The CA that signed the server certificate.
pub fn ca() -> String {
    data_dir().join("ca.crt").to_string_lossy().into_owned()
}

/// A CA that signed nothing this server shows.
pub fn wrong_ca() -> String {
    data_dir()
        .join("wrong-ca.crt")
        .to_string_lossy()
        .into_owned()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new("openssl")
        .args(args)
        .current_dir(dir)
        .output()
        .expect("run openssl (scripts/install-deps.sh installs it)");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A self-signed CA: `<name>.crt` and `<name>.key`.
fn make_ca(dir: &Path, name: &str) {
    let (crt, key) = (format!("{name}.crt"), format!("{name}.key"));
    openssl(
        dir,
        &[
            "req",
            "-x509",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-days",
            "2",
            "-subj",
            &format!("/CN=libmember test {name}"),
            "-addext",
            "basicConstraints=critical,CA:TRUE",
            "-addext",
            "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout",
            &key,
            "-out",
            &crt,
        ],
    );
}

/// Certificates, `ssl=on`, and a scram-sha-256 line for [`PW_ROLE`] ahead of the trust lines.
fn setup(data: &Path) -> Vec<String> {
    make_ca(data, "ca");
    make_ca(data, "wrong-ca");
    openssl(
        data,
        &[
            "req",
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:prime256v1",
            "-nodes",
            "-subj",
            "/CN=localhost",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ],
    );
    fs::write(
        data.join("server.ext"),
        "subjectAltName=DNS:localhost,IP:127.0.0.1\nbasicConstraints=CA:FALSE\n\
         keyUsage=digitalSignature\nextendedKeyUsage=serverAuth\n",
    )
    .unwrap();
    openssl(
        data,
        &[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "2",
            "-extfile",
            "server.ext",
            "-out",
            "server.crt",
        ],
    );
    use std::os::unix::fs::PermissionsExt;
    fs::set_permissions(data.join("server.key"), fs::Permissions::from_mode(0o600)).unwrap();
    let hba = data.join("pg_hba.conf");
    let rest = fs::read_to_string(&hba).unwrap();
    fs::write(
        &hba,
        format!("host all {PW_ROLE} 127.0.0.1/32 scram-sha-256\n{rest}"),
    )
    .unwrap();
    [
        "ssl=on",
        "ssl_cert_file=server.crt",
        "ssl_key_file=server.key",
    ]
    .iter()
    .flat_map(|s| ["-c".to_string(), s.to_string()])
    .collect()
}
