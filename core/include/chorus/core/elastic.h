// What a worker of an elastic job (chorusrun --nnodes MIN:MAX) can ask its launcher.
//
// A node that starts while the job runs waits to join. Workers that call nodes_waiting() at a
// step boundary (say, where they checkpoint) decide together when to let it in:
//
//   if (chorus::elastic::nodes_waiting(world) > 0) {
//     save_checkpoint();
//     chorus::elastic::request_new_round(world);
//     return 0;  // every rank leaves; chorusrun starts the next round, the newcomer included
//   }
//
// Workers that never call it are stopped as soon as a node waits, as torchrun does, and resume
// from their last checkpoint.
#pragma once

#include <chrono>
#include <string>

#include "chorus/core/communicator.h"

namespace chorus::elastic {

// True in a worker of an elastic chorusrun (CHORUS_ELASTIC=1).
bool launched();

// How many nodes wait to join, as rank 0 of `comm` reads it (a collective: every rank gets the
// same answer, so all leave at the same step). 0 outside an elastic job. The first call tells
// chorusrun that the workers watch, so it waits for them instead of stopping them.
int nodes_waiting(Communicator& comm);

// Tells chorusrun that the workers leave to let the waiting nodes in (a collective; call it on
// every rank, then exit with 0). Outside an elastic job it does nothing.
void request_new_round(Communicator& comm);

// ---- For in-process recovery (chorus::elastic::run in chorus/elastic.h builds on these) ----
// Tells chorusrun that this round's workers recover in process: on a change of membership it
// keeps them running and tells them their new place instead of restarting them.
void announce_in_process(Communicator& comm);
// Asks this node's chorusrun for a new round (the group failed here; `why` for its log).
void ask_for_new_round(const std::string& why);
// True when chorusrun has formed a round newer than the one this worker is in (its group is
// then being re-formed: a peer was lost). Cheap: one question to the local agent.
bool next_round_published();
// Blocks until chorusrun tells this worker its place in a round newer than the one it is in,
// then sets the variables (RANK, WORLD_SIZE, CHORUS_STORE_PORT, ...) so that
// init_process_group() joins it. Throws TimeoutError after `timeout`.
void await_next_round(std::chrono::milliseconds timeout);

// CHORUS_ELASTIC_TRACE=1 (for the agents and the workers): "[unix ms N] ", the wall-clock time
// to put before a line about a change of membership, so that the steps of a recovery can be
// lined up across hosts; "" otherwise.
std::string trace_stamp();

}  // namespace chorus::elastic
