// The participant services of the deployment. Each entry is one participant deployment: a parameter
// `Service<key>TableName` (and `Service<key>Name` unless the name is fixed), a table `Service<key>Table`,
// a message key (secret) `Service<key>MessageKey`, a function `Participant<key>Function` running its
// binary with its role, log group and `live` alias, its resource policy naming the coordinator's and
// the sweeper's roles (`Participant<key>InvokeByCoordinator`, `Participant<key>InvokeBySweeper`), its
// entries in the coordinator's and sweeper's registries (PARTICIPANTS, PARTICIPANT_KEYS,
// PARTICIPANT_TABLES) and grants, its table's stream into the stream processor, its alarms and its
// outputs (lib/stack.ts builds them all from this list).
//
// Adding a service that the generic participant serves (the built-in operations) is one more entry
// here, for example
//   { key: 'C', defaultName: 'service-c', defaultTableName: 'service-c-data', ordinal: 'third' },
// then `bash infra/cdk/synth.sh` and `bash infra/check.sh`. A service with its own participant (its
// own crate under functions/, built on the participant library with its own operations, as the
// example inventory) names its binary (lib/code.ts, BINARIES), has a fixed name (its operation
// schemas in SERVICE_OPERATIONS, infra/service-operations.json, are keyed by it), and its schemas go
// into infra/service-operations.json (infra/DEPLOY.md, "A service with its own participant"). A
// resource participant (the participant library driving a resource beyond DynamoDB, as the example
// payments) also says where its resource is (`resource`: a parameter passed as one variable) and how
// long its function may run (infra/DEPLOY.md, "A resource participant").

import { readFileSync } from 'node:fs';
import * as path from 'node:path';

import { Binary, repositoryRoot } from './code';

export interface ParticipantService {
  /** The key in the logical ids and parameter names (A, B, ..., Inventory). */
  readonly key: string;
  /** Default of `Service<key>Name` (the registry name clients put in "service"), or the name itself when fixed. */
  readonly defaultName: string;
  /** Default of `Service<key>TableName`: the service's data table. */
  readonly defaultTableName: string;
  /** For descriptions: "first", "second", ... or what the service is ("inventory"). */
  readonly ordinal: string;
  /**
   * The binary its function runs: the generic `participant` unless given. A service with its own
   * participant (functions/<binary>: the participant library with its own operations) names it.
   */
  readonly binary?: Binary;
  /**
   * The registry name is `defaultName`, not a parameter: the service's operation schemas
   * (SERVICE_OPERATIONS, keyed by service name) and its clients name it, so it may not be renamed
   * at deploy time.
   */
  readonly fixedName?: boolean;
  /**
   * A resource participant (functions/<binary> calls `with_resource`: try, confirm and cancel of an
   * external resource behind the library's barrier entries in its table). Its role may read and write
   * its barrier entries only (functions/twopc/src/participant/resource.rs), nothing of the
   * transactions table.
   */
  readonly resource?: ResourceSettings;
}

/** What a resource participant needs beyond a participant's settings. */
export interface ResourceSettings {
  /** The stack parameter (SAM's too) holding the resource's address. */
  readonly parameter: string;
  /** The function's variable that gets the parameter's value (what its binary reads). */
  readonly variable: string;
  readonly default: string;
  readonly allowedPattern: string;
  readonly constraintDescription: string;
  readonly description: string;
  /**
   * The function's timeout, in seconds: longer than its slowest path (a prepare retries the resource
   * until the transaction's deadline, at most MAX_TIMEOUT_MS = 25 s, and the clock margin).
   */
  readonly timeout: number;
}

export const SERVICES: readonly ParticipantService[] = [
  { key: 'A', defaultName: 'service-a', defaultTableName: 'service-a-data', ordinal: 'first' },
  { key: 'B', defaultName: 'service-b', defaultTableName: 'service-b-data', ordinal: 'second' },
  // The example service with its own participant (functions/inventory: reserve and release).
  {
    key: 'Inventory',
    defaultName: 'inventory',
    defaultTableName: 'inventory-data',
    ordinal: 'inventory',
    binary: 'inventory',
    fixedName: true,
  },
  // The example resource participant (functions/payments: charge = authorize, capture, void through a
  // payment API over HTTPS, from outside any VPC). Its table holds the library's barrier entries.
  {
    key: 'Payments',
    defaultName: 'payments',
    defaultTableName: 'payments-data',
    ordinal: 'payments',
    binary: 'payments',
    fixedName: true,
    resource: {
      parameter: 'PaymentApiUrl',
      variable: 'PAYMENT_API_URL',
      // A placeholder: nothing answers there. Give your payment API's base URL.
      default: 'https://payments.example.com',
      allowedPattern: 'https://[^\\s]+',
      constraintDescription: 'an https:// URL',
      description:
        'Base URL of the payment API the example payments participant charges cards through (its ' +
        'PAYMENT_API_URL). The default is a placeholder: the example needs a real payment API with ' +
        'idempotency keys (POST /v1/authorizations, /v1/authorizations/{id}/capture and /void) to work. ' +
        'The payments function calls it over HTTPS from outside any VPC (no VPC configuration needed).',
      // A prepare may retry the payment API until the deadline and the clock margin (25.25 s at most),
      // then records the outcome; a confirm or a cancel makes one 2 s request per charge.
      timeout: 40,
    },
  },
];

/** The binary a service's function runs. */
export const binaryOf = (service: ParticipantService): Binary => service.binary ?? 'participant';

/** Where the services' own operation schemas are: the coordinator's SERVICE_OPERATIONS. */
export const SERVICE_OPERATIONS_FILE = path.join('infra', 'service-operations.json');

/**
 * The coordinator's SERVICE_OPERATIONS: infra/service-operations.json (a test of the repository holds
 * it to what the services declare), read at synthesis and written compact. Fails, naming the file,
 * when it is missing or not a JSON object.
 */
export function serviceOperations(root: string = repositoryRoot()): string {
  const file = path.join(root, SERVICE_OPERATIONS_FILE);
  let parsed: unknown;
  try {
    parsed = JSON.parse(readFileSync(file, 'utf8'));
  } catch (error) {
    throw new Error(`${SERVICE_OPERATIONS_FILE}: ${(error as Error).message}`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed)) {
    throw new Error(`${SERVICE_OPERATIONS_FILE} is not a JSON object of services' operation schemas`);
  }
  return JSON.stringify(parsed);
}
