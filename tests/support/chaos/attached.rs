//! The table an attached set answers from, as the cluster history load writes it
//! (docs/attach.md): the application's writers insert their rows and then tell the module with
//! ADD or MADD, as the sign-up flow does, and an outside writer inserts rows the module learns
//! only from the change log.

/// An attached set's source table: `table` (quoted and qualified) with the items in `column`,
/// stored in their canonical spelling; `url` reaches its database as a role that may write it.
pub struct Source {
    pub url: String,
    pub table: String,
    pub column: String,
    /// How long after its commit an outside INSERT may go unanswered (`Rules::outside_us`).
    pub outside_ms: u64,
}

impl Source {
    pub fn connect(&self) -> postgres::Client {
        postgres::Client::connect(&self.url, postgres::NoTls)
            .unwrap_or_else(|e| panic!("connect to the source's database: {e}"))
    }

    /// Inserts `items` in one statement (its own transaction).
    pub fn insert(&self, pg: &mut postgres::Client, items: &[String]) -> Result<(), String> {
        pg.execute(
            &format!(
                "INSERT INTO {} ({}) SELECT unnest($1::text[])",
                self.table, self.column
            ),
            &[&items],
        )
        .map(drop)
        .map_err(|e| format!("ERR insert into the source: {e}"))
    }

    /// Every item in the table now.
    pub fn members(&self, pg: &mut postgres::Client) -> Vec<String> {
        pg.query(&format!("SELECT {} FROM {}", self.column, self.table), &[])
            .expect("read the source")
            .iter()
            .map(|r| r.get(0))
            .collect()
    }

    /// Whether `item` is in the table now.
    pub fn has(&self, pg: &mut postgres::Client, item: &str) -> bool {
        pg.query_one(
            &format!(
                "SELECT EXISTS (SELECT FROM {} WHERE {} = $1)",
                self.table, self.column
            ),
            &[&item],
        )
        .expect("read the source")
        .get(0)
    }
}
