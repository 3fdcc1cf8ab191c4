// The participant services of the deployment. Each entry is one participant deployment: parameters
// `Service<key>Name` and `Service<key>TableName`, a table `Service<key>Table`, a message key (secret)
// `Service<key>MessageKey`, a function `Participant<key>Function` with its role, log group and `live`
// alias, its resource policy naming the coordinator's and the sweeper's roles
// (`Participant<key>InvokeByCoordinator`, `Participant<key>InvokeBySweeper`), its entries in the
// coordinator's and sweeper's registries (PARTICIPANTS, PARTICIPANT_KEYS, PARTICIPANT_TABLES) and
// grants, its table's stream into the stream processor, its alarms and its outputs (lib/stack.ts
// builds them all from this list).
//
// Adding a service is one more entry here, for example
//   { key: 'C', defaultName: 'service-c', defaultTableName: 'service-c-data', ordinal: 'third' },
// then `bash infra/cdk/synth.sh` and `bash infra/check.sh`.

export interface ParticipantService {
  /** The letter in the logical ids and parameter names (A, B, ...). */
  readonly key: string;
  /** Default of `Service<key>Name`: the registry name clients put in "service". */
  readonly defaultName: string;
  /** Default of `Service<key>TableName`: the service's data table. */
  readonly defaultTableName: string;
  /** For descriptions: "first", "second", ... */
  readonly ordinal: string;
}

export const SERVICES: readonly ParticipantService[] = [
  { key: 'A', defaultName: 'service-a', defaultTableName: 'service-a-data', ordinal: 'first' },
  { key: 'B', defaultName: 'service-b', defaultTableName: 'service-b-data', ordinal: 'second' },
];
