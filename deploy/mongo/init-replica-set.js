// Health check of the `mongo` service: initiates the one-member replica set `rs0` on the first run
// (idempotent: rs.status() succeeds once it exists) and reports healthy only while this member is
// the writable primary, so majority-acknowledged, journaled writes work.
try {
  rs.status();
} catch (e) {
  if (e.codeName !== "NotYetInitialized") throw e;
  rs.initiate({ _id: "rs0", members: [{ _id: 0, host: "mongo:27017" }] });
}
if (!db.hello().isWritablePrimary) {
  quit(1);
}
